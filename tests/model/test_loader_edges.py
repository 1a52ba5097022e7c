"""Loading checkpoints as they come: float16 weights, recomputed rotary buffers left out, generation_config.json's
end tokens and sampling defaults, and one clear ModelLoadError for weights the config does not describe."""

import json
import shutil

import pytest
import torch
from test_load_errors import _copy_with_weights

from pagedllm.errors import ModelLoadError
from pagedllm.model.loader import load_model


def test_a_checkpoint_with_rotary_inv_freq_buffers_loads(tmp_path, tiny_llama_dir):
    """Older Llama checkpoints store model.layers.N.self_attn.rotary_emb.inv_freq (a recomputed buffer); vLLM and
    transformers skip it, and so does pagedllm."""
    def with_inv_freq(tensors):
        for n in range(3):
            tensors[f"model.layers.{n}.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        return {"model.safetensors": tensors}

    plain, _ = load_model(tiny_llama_dir)
    model, _ = load_model(_copy_with_weights(tiny_llama_dir, tmp_path / "m", with_inv_freq))
    assert torch.equal(model.model.embed_tokens.weight, plain.model.embed_tokens.weight)


def _with_config(tiny_llama_dir, target, name, content):
    shutil.copytree(tiny_llama_dir, target)
    (target / name).write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return target


def test_weights_of_another_shape_than_the_config_implies_are_one_clear_error(tmp_path, tiny_llama_dir):
    """intermediate_size off by some rows: ModelLoadError naming the weight and both shapes, not torch's
    RuntimeError from load_state_dict."""
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    path = _with_config(tiny_llama_dir, tmp_path / "m", "config.json", config | {"intermediate_size": 96})
    with pytest.raises(ModelLoadError, match=r"mlp\.\w+_proj\.weight has shape \(\d+, \d+\), config implies"):
        load_model(path)


def _generation(tmp_path, tiny_llama_dir, generation):
    from pagedllm.model.hf_loader import read_hf_config

    return read_hf_config(_with_config(tiny_llama_dir, tmp_path / "m", "generation_config.json", generation))


def test_generation_config_end_tokens_are_added_once(tmp_path, tiny_llama_dir):
    """config.json's eos (2) repeated in generation_config.json is not listed twice; a single int is taken
   ."""
    assert _generation(tmp_path / "a", tiny_llama_dir, {"eos_token_id": [2, 5]}).eos_token_ids == [2, 5]
    assert _generation(tmp_path / "b", tiny_llama_dir, {"eos_token_id": 7}).eos_token_ids == [2, 7]


def test_generation_config_negative_end_token_is_refused(tmp_path, tiny_llama_dir):
    with pytest.raises(ModelLoadError, match="eos_token_id must be an integer"):
        _generation(tmp_path, tiny_llama_dir, {"eos_token_id": [2, -1]})


def test_generation_config_nulls_are_no_sampling_defaults(tmp_path, tiny_llama_dir):
    """transformers writes "top_k": null etc.; a null is no default."""
    config = _generation(tmp_path, tiny_llama_dir, {"temperature": 0.6, "top_k": None, "top_p": None})
    assert config.sampling_defaults == {"temperature": 0.6}


def test_a_generation_config_that_is_no_object_is_ignored(tmp_path, tiny_llama_dir):
    config = _generation(tmp_path, tiny_llama_dir, [1, 2])
    assert config.eos_token_ids == [2]


def test_a_config_json_that_is_not_utf8_is_one_error(tmp_path, tiny_llama_dir):
    path = _with_config(tiny_llama_dir, tmp_path / "m", "config.json", b"\xff\xfe{}")
    with pytest.raises(ModelLoadError, match="config.json is not valid JSON"):
        load_model(path)


def test_a_transposed_weight_of_the_same_size_is_one_clear_error(tmp_path, tiny_llama_dir):
    """[in, out] stored for [out, in] has as many elements: still refused by name."""
    def transposed(tensors):
        name = "model.layers.0.mlp.up_proj.weight"
        return {"model.safetensors": {**tensors, name: tensors[name].t().contiguous()}}

    with pytest.raises(ModelLoadError, match=r"up_proj\.weight has shape \(64, 128\), config implies \(128, 64\)"):
        load_model(_copy_with_weights(tiny_llama_dir, tmp_path / "m", transposed))


def test_a_float16_checkpoint_loads(tmp_path, tiny_llama_dir):
    """Most HF checkpoints are stored as float16."""
    half = _copy_with_weights(tiny_llama_dir, tmp_path / "m",
                              lambda t: {"model.safetensors": {k: v.half() for k, v in t.items()}})
    model, _ = load_model(half)
    plain, _ = load_model(tiny_llama_dir)
    torch.testing.assert_close(model.lm_head.weight, plain.lm_head.weight, atol=1e-3, rtol=1e-3)


def test_an_unknown_layer_tensor_name_maps_to_none():
    """e.g. a mixture of experts' blk.N.ffn_gate_exps.weight: None, which read_gguf turns into "unsupported tensor"
    (a ModelLoadError), not a KeyError."""
    from pagedllm.model.gguf_loader import hf_name

    assert hf_name("blk.0.ffn_gate_exps.weight") is None
    assert hf_name("blk.0.attn_q_norm.weight") == "model.layers.0.self_attn.q_norm.weight"  # Qwen3's
    assert hf_name("blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
