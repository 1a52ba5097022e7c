"""Every way a model path can be wrong ends in a ModelLoadError that names the file and the problem."""

import json
import shutil

import pytest
import torch
from gguf_writer import write_gguf
from tiny import make_hf_model

from pagedllm.errors import ModelLoadError
from pagedllm.model.loader import load_model
from pagedllm.model.tokenizer import load_tokenizer


def test_wrong_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)


def test_directory_without_weights(tmp_path, tiny_llama_dir):
    shutil.copy(tiny_llama_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load_model(tmp_path)


def test_missing_shard_named_in_index(tmp_path, tiny_llama_dir):
    shutil.copy(tiny_llama_dir / "config.json", tmp_path / "config.json")
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="model-00001-of-00002.safetensors"):
        load_model(tmp_path)


def test_truncated_safetensors(tmp_path, tiny_llama_dir):
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_model(tmp_path / "m")


def test_unsupported_architecture_in_config(tmp_path, tiny_llama_dir):
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["model_type"] = "gpt2"
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'"):
        load_model(tmp_path / "m")


def test_weights_that_do_not_fit_the_config(tmp_path, tiny_llama_dir):
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["num_hidden_layers"] = 4
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="weights missing: model.layers.3"):
        load_model(tmp_path / "m")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_gguf(make_hf_model("llama"), tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.mark.parametrize("keep", [10, 1000, 0.6])
def test_truncated_gguf(tmp_path, tiny_gguf, keep):
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(keep * len(data)) if isinstance(keep, float) else keep])
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        load_model(cut)


def test_not_a_gguf_file(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_text("hello, I am not a model")
    with pytest.raises(ModelLoadError, match="junk.gguf"):
        load_model(junk)


def test_unsupported_gguf_architecture(tmp_path, tiny_gguf):
    data = tiny_gguf.read_bytes().replace(b"llama", b"gemma", 1)  # general.architecture's value comes first
    other = tmp_path / "other.gguf"
    other.write_bytes(data)
    with pytest.raises(ModelLoadError, match="unsupported GGUF architecture 'gemma'"):
        load_model(other)


def test_unsupported_dtype(tiny_llama_dir):
    with pytest.raises(ModelLoadError, match="unsupported dtype"):
        load_model(tiny_llama_dir, torch.float16)
