"""ModelConfig from HF config dicts (transformers v4 and v5 spellings) and GGUF metadata."""

import pytest

from pagedllm.errors import ModelLoadError
from pagedllm.model.config import ModelConfig, RopeScaling, config_from_gguf_metadata

BASE = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4}  # fmt: skip
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip


def test_defaults_fill_in_mha_and_head_dim():
    config = ModelConfig.from_hf_dict(BASE)
    assert (config.num_kv_heads, config.head_dim, config.attention_bias) == (4, 16, False)


def test_v4_and_v5_rope_spellings_agree():
    v4 = ModelConfig.from_hf_dict({**BASE, "rope_theta": 5e5, "rope_scaling": LLAMA3})
    v5 = ModelConfig.from_hf_dict({**BASE, "rope_parameters": {**LLAMA3, "rope_theta": 5e5}})
    assert v4 == v5
    assert v4.rope_theta == 5e5 and v4.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)


def test_qwen2_has_biases_and_eos_list():
    config = ModelConfig.from_hf_dict({**BASE, "model_type": "qwen2", "eos_token_id": [7, 8]})
    assert config.attention_bias and config.eos_token_ids == [7, 8]


def test_round_trip_through_hf_dict():
    config = ModelConfig.from_hf_dict({**BASE, "num_key_value_heads": 1, "rope_scaling": LLAMA3, "eos_token_id": 2})
    assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config


@pytest.mark.parametrize(
    "change,message",
    [({"model_type": "gpt2"}, "unsupported architecture"), ({"num_key_value_heads": 3}, "not a multiple"),
     ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "unsupported rope scaling")],
)  # fmt: skip
def test_invalid_configs(change, message):
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_hf_dict({**BASE, **change})


def test_missing_key():
    with pytest.raises(ModelLoadError, match="'hidden_size'"):
        ModelConfig.from_hf_dict({k: v for k, v in BASE.items() if k != "hidden_size"})


def test_from_gguf_metadata():
    meta = {"general.architecture": "llama", "llama.block_count": 30, "llama.embedding_length": 576,
            "llama.feed_forward_length": 1536, "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3,
            "llama.rope.freq_base": 1e5, "tokenizer.ggml.tokens": range(49152), "tokenizer.ggml.eos_token_id": 2}  # fmt: skip
    config = config_from_gguf_metadata(meta)
    assert (config.vocab_size, config.head_dim, config.num_kv_heads, config.eos_token_ids) == (49152, 64, 3, [2])
    with pytest.raises(ModelLoadError, match="lacks llama.block_count"):
        config_from_gguf_metadata({k: v for k, v in meta.items() if k != "llama.block_count"})
