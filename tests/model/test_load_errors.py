"""Every way a model path can be wrong ends in a ModelLoadError that names the file and the problem."""

import json
import re
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


def test_a_gguf_tensor_off_its_alignment_is_refused(tmp_path, tiny_gguf):
    import struct

    from gguf import GGUFReader

    reader = GGUFReader(tiny_gguf)
    offset_field = reader.tensors[0].field.parts[-1]  # the first tensor's offset from the data start: 0
    where = offset_field.ctypes.data - reader.data.ctypes.data
    data = bytearray(tiny_gguf.read_bytes())
    struct.pack_into("<Q", data, where, 4)
    shifted = tmp_path / "shifted.gguf"
    shifted.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="not aligned to 32 bytes"):
        load_model(shifted)


def _copy_with_weights(tiny_llama_dir, target, change):
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_llama_dir, target)
    tensors = load_file(target / "model.safetensors")
    (target / "model.safetensors").unlink()
    for name, part in change(tensors).items():
        save_file(part, target / name)
    return target


def test_integer_weights_are_refused(tmp_path, tiny_llama_dir):
    def to_int8(tensors):
        name = "model.layers.0.mlp.up_proj.weight"
        return {"model.safetensors": {**tensors, name: tensors[name].to(torch.int8)}}

    with pytest.raises(ModelLoadError, match=r"up_proj.weight is stored as torch.int8"):
        load_model(_copy_with_weights(tiny_llama_dir, tmp_path / "m", to_int8))


def test_a_weight_in_two_files_is_refused(tmp_path, tiny_llama_dir):
    def split_with_a_repeat(tensors):
        names = sorted(tensors)
        return {"a.safetensors": {n: tensors[n] for n in names[:5]},
                "b.safetensors": {n: tensors[n] for n in names[4:]}}  # fmt: skip

    with pytest.raises(ModelLoadError, match="weights stored in more than one file"):
        load_model(_copy_with_weights(tiny_llama_dir, tmp_path / "m", split_with_a_repeat))


@pytest.mark.parametrize("index", ['{"weight_map": ["a"]}', '[1, 2]', '{"weight_map": {"x": 3}}', b"\xff\xfe{"])
def test_a_malformed_index_is_refused(tmp_path, tiny_llama_dir, index):
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors.index.json"
    path.write_bytes(index if isinstance(index, bytes) else index.encode())
    with pytest.raises(ModelLoadError, match="not a valid safetensors index"):
        load_model(tmp_path / "m")


def test_a_malformed_tokenizer_config_is_one_error(tmp_path, tiny_llama_dir):
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    (tmp_path / "m" / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="cannot load a tokenizer from"):
        load_tokenizer(tmp_path / "m")


@pytest.mark.parametrize("shard", ["../other/model.safetensors", "/tmp/model.safetensors", "sub/../../model.safetensors", "..", ""])
def test_an_index_naming_shards_outside_the_model_directory_is_refused(tmp_path, tiny_llama_dir, shard):
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    index = {"weight_map": {"model.embed_tokens.weight": shard}}
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="outside the model directory"):
        load_model(tmp_path / "m")


@pytest.mark.parametrize("head", ["differs", "equals"])
def test_a_stored_head_of_a_tied_model_is_dropped_with_a_warning_where_it_differs(tmp_path, tiny_llama_dir, caplog,
                                                                                  head):
    def tied_with_head(tensors):
        embeddings = tensors["model.embed_tokens.weight"]
        tensors["lm_head.weight"] = embeddings + 1.0 if head == "differs" else embeddings.clone()
        return {"model.safetensors": tensors}

    path = _copy_with_weights(tiny_llama_dir, tmp_path / "m", tied_with_head)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with caplog.at_level("WARNING", logger="pagedllm"):
        model, _ = load_model(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert ("stored lm_head.weight differs from the embeddings" in caplog.text) == (head == "differs")


@pytest.mark.parametrize("change, message", [({"rms_norm_eps": -1.0}, r"config\.json: rms_norm_eps must be positive"),
                                             ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
                                              r"config\.json: unsupported rope scaling type 'dynamic'"),
                                             ({"hidden_act": "gelu"}, r"config\.json: unsupported hidden_act")])
def test_a_config_error_names_the_file(tmp_path, tiny_llama_dir, change, message):
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ModelLoadError, match=re.escape(str(tmp_path / "m")) + "/" + message):
        load_model(tmp_path / "m")
