"""`pagedllm convert --to-hf`: the written directory loads in transformers with the same logits, and in pagedllm."""

import pytest
import torch
from gguf_writer import write_gguf
from tiny import make_hf_model, make_tiny_tokenizer

from pagedllm.entrypoints.cli import main
from pagedllm.model.loader import load_model

IDS = [5, 17, 200, 33, 9, 100, 101, 44]


@pytest.mark.parametrize("rope", [
    {},
    # a rope_freqs tensor in the GGUF, the llama3 scaling again in config.json
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 16.0,
                      "original_max_position_embeddings": 256}},
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
])  # fmt: skip
def test_convert_gguf_to_hf_round_trip(tmp_path, monkeypatch, rope):
    monkeypatch.setenv("PAGEDLLM_CACHE_DIR", str(tmp_path / "cache"))  # the tokenizer's conversion goes there
    monkeypatch.setenv("PAGEDLLM_DISABLE_KERNELS", "1")  # run alone, it would build them anew in that cache
    original = make_hf_model("llama", num_key_value_heads=1, tie_word_embeddings=True, **rope)
    tokenizer = make_tiny_tokenizer()
    gguf = write_gguf(original, tmp_path / "tiny.gguf", tokenizer=tokenizer)
    out = tmp_path / "hf"
    assert main(["convert", "--to-hf", str(out), "--model", str(gguf)]) == 0

    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(torch.tensor([IDS])).logits, original(torch.tensor([IDS])).logits)
    text = "Each sequence owns a block table."
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == tokenizer(text).input_ids
    _, config = load_model(out)
    assert config.tie_word_embeddings and config.num_kv_heads == 1


def test_rope_freqs_that_config_json_cannot_hold_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import numpy as np

    monkeypatch.setenv("PAGEDLLM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PAGEDLLM_DISABLE_KERNELS", "1")
    freqs = np.linspace(1.0, 3.0, 8)  # a line: no llama3 scaling gives it
    gguf = write_gguf(make_hf_model("llama"), tmp_path / "tiny.gguf", tokenizer=make_tiny_tokenizer(), rope_freqs=freqs)
    _, config = load_model(gguf)  # it runs
    assert config.rope_scaling.factors == pytest.approx(tuple(freqs))
    assert main(["convert", "--to-hf", str(tmp_path / "hf"), "--model", str(gguf)]) == 2
    assert "not a llama3 rope scaling" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_convert_refuses_to_overwrite(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["convert", "--to-hf", str(tmp_path), "--model", str(tmp_path / "x.gguf")]) == 2
    assert "--force" in capsys.readouterr().err


def test_convert_reports_bad_model_path(tmp_path, capsys):
    assert main(["convert", "--to-hf", str(tmp_path / "out"), "--model", str(tmp_path / "missing.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_force_over_a_sharded_model_leaves_only_the_new_one(tmp_path, tiny_llama_dir, capsys):
    from safetensors.torch import load_file, save_file

    out = tmp_path / "old"
    other = make_hf_model("llama", seed=7)
    other.save_pretrained(out, max_shard_size="100KB")  # shards and an index that a loader reads first
    assert (out / "model.safetensors.index.json").is_file()
    assert main(["convert", "--to-hf", str(out), "--model", str(tiny_llama_dir), "--force"]) == 0
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert not (out / "model.safetensors.index.json").exists()
    written = capsys.readouterr().out
    assert "model.safetensors" in written and "index" not in written
    expected = load_file(tiny_llama_dir / "model.safetensors")
    converted = load_file(out / "model.safetensors")
    assert all(torch.equal(converted[name], tensor) for name, tensor in expected.items())


def test_an_empty_output_path_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "--to-hf", "", "--model", str(tmp_path / "x.gguf")]) == 2
    assert "empty" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_an_hf_directorys_sampling_settings_survive_conversion(tmp_path, tiny_llama_dir):
    import json
    import shutil

    from pagedllm.model.hf_loader import read_hf_config

    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    generation = json.loads((tmp_path / "m" / "generation_config.json").read_text())
    settings = {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 64}
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps(generation | settings))
    assert main(["convert", "--to-hf", str(tmp_path / "out"), "--model", str(tmp_path / "m")]) == 0
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert {key: written[key] for key in settings} == settings
    assert read_hf_config(tmp_path / "out").sampling_defaults == {"temperature": 0.6, "top_p": 0.9, "max_tokens": 64}
