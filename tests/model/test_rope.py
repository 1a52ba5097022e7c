"""Rope scaling kinds: read from config.json and GGUF metadata as transformers and llama.cpp read them, with the
frequencies and cos/sin scale transformers computes."""

import math

import pytest
import torch

from pagedllm.errors import ModelLoadError
from pagedllm.model.gguf_config import config_from_gguf_metadata
from pagedllm.model.hf_config import from_hf_dict, to_hf_dict
from pagedllm.model.rope import (FrequencyFactorsRope, Llama3Rope, LinearRope, YarnRope, llama3_from_factors,
                                 rope_attention_factor, rope_inv_freq)  # fmt: skip

BASE = {"model_type": "llama", "vocab_size": 100, "hidden_size": 256, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "rope_theta": 10000.0, "max_position_embeddings": 4096}  # fmt: skip
SCALINGS = [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    {"rope_type": "yarn", "factor": 4.0},  # original_max_position_embeddings: max_position_embeddings
    {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16, "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0},
    {"rope_type": "yarn", "factor": 2.0, "truncate": False, "attention_factor": 1.3},
    {"type": "yarn", "factor": 32.0, "beta_fast": 4, "beta_slow": 4},  # the ramp's ends meet
    {"type": "linear", "factor": 2.5},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 512},
]  # fmt: skip


@pytest.mark.parametrize("scaling", SCALINGS)
def test_frequencies_and_cos_sin_scale_are_transformers_own(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = from_hf_dict({**BASE, "rope_scaling": dict(scaling)})
    hf = LlamaConfig(**{k: v for k, v in BASE.items() if k != "model_type"}, rope_scaling=dict(scaling))
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[hf.rope_parameters["rope_type"]](hf, "cpu")
    assert torch.equal(rope_inv_freq(config.rope_theta, config.head_dim, config.rope_scaling), inv_freq)
    assert rope_attention_factor(config.rope_scaling) == attention_factor


@pytest.mark.parametrize("scaling", SCALINGS)
def test_each_kind_survives_convert_to_hf(scaling):
    config = from_hf_dict({**BASE, "rope_parameters": {**scaling, "rope_theta": 10000.0}})
    assert from_hf_dict(to_hf_dict(config)) == config
    assert from_hf_dict({**BASE, "rope_scaling": scaling}) == config  # v4's spelling


def test_yarn_defaults_as_transformers_fills_them():
    config = from_hf_dict({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert config.rope_scaling == YarnRope(4.0, 4096, 1 + 0.1 * math.log(4.0), 32.0, 1.0, True)


def test_linear_scaling_lengthens_the_context_as_vllm_derives_it():
    """vLLM's max_model_len is max_position_embeddings x factor for linear scaling; llama3 and yarn configs already
    name the longer length."""
    assert from_hf_dict({**BASE, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}).context_limit == 8192
    assert from_hf_dict({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}).context_limit == 4096


GGUF = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 256,
        "llama.feed_forward_length": 128, "llama.attention.head_count": 4, "llama.context_length": 4096,
        "tokenizer.ggml.tokens": range(100)}  # fmt: skip


@pytest.mark.parametrize("keys,expected", [
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}, LinearRope(4.0)),
    ({"llama.rope.scaling.factor": 2.0}, LinearRope(2.0)),  # llama.cpp's default type
    ({"llama.rope.scale_linear": 3.0}, LinearRope(3.0)),  # older files
    ({"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 1.0}, None),
    ({"llama.rope.scaling.factor": 0.0}, None),  # llama.cpp reads 0 as "not set"
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
      "llama.rope.scaling.original_context_length": 1024}, YarnRope(4.0, 1024, 1 + 0.1 * math.log(4.0))),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 2.0, "llama.rope.scaling.yarn_beta_fast": 8.0,
      "llama.rope.scaling.yarn_beta_slow": 2.0}, YarnRope(2.0, 4096, 1 + 0.1 * math.log(2.0), 8.0, 2.0)),
])  # fmt: skip
def test_gguf_rope_scaling_as_llama_cpp_reads_it(keys, expected):
    assert config_from_gguf_metadata({**GGUF, **keys}).rope_scaling == expected


@pytest.mark.parametrize("keys,freqs,message", [
    ({"llama.rope.scaling.type": "longrope", "llama.rope.scaling.factor": 2.0}, None, "unsupported GGUF rope scaling"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 2.0, "llama.rope.scaling.yarn_log_multiplier":
      0.1}, None, "unsupported yarn rope scaling setting llama.rope.scaling.yarn_log_multiplier"),
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}, (1.0,) * 32,
     "rope_freqs tensor together"),
    ({}, (1.0,) * 8, "rope_freqs holds 8 factors; the head's rotary has 32 frequencies"),
    ({}, (1.0,) * 31 + (0.0,), "positive finite"),
    ({"llama.rope.scaling.type": 2}, None, "scaling.type must be a string"),
])  # fmt: skip
def test_gguf_rope_scaling_refusals(keys, freqs, message):
    with pytest.raises(ModelLoadError, match=message):
        config_from_gguf_metadata({**GGUF, **keys}, freqs)


def _factors(scaling: Llama3Rope, theta: float, head_dim: int) -> tuple[float, ...]:
    """A rope_freqs tensor as llama.cpp's converter writes it (float32)."""
    plain = rope_inv_freq(theta, head_dim, None)
    return tuple(torch.tensor((plain / scaling.scale(plain, theta)).tolist(), dtype=torch.float32).tolist())


@pytest.mark.parametrize("scaling,theta,head_dim", [
    (Llama3Rope(8.0, 1.0, 4.0, 8192), 500000.0, 128),  # Llama 3.1
    (Llama3Rope(32.0, 1.0, 4.0, 8192), 500000.0, 64),  # Llama 3.2 1B
    (Llama3Rope(16.0, 1.0, 2.0, 64), 10000.0, 64),
])  # fmt: skip
def test_a_rope_freqs_tensor_reads_as_the_llama3_scaling_it_came_from(scaling, theta, head_dim):
    factors = _factors(scaling, theta, head_dim)
    assert llama3_from_factors(factors, theta) == scaling
    config = config_from_gguf_metadata({**GGUF, "llama.rope.freq_base": theta, "llama.attention.head_count":
                                        256 // head_dim}, factors)  # fmt: skip
    assert config.rope_scaling == FrequencyFactorsRope(factors)
    plain = rope_inv_freq(theta, head_dim, None)
    assert torch.allclose(rope_inv_freq(theta, head_dim, config.rope_scaling), scaling.scale(plain, theta), rtol=1e-6)
    assert from_hf_dict(to_hf_dict(config)).rope_scaling == scaling  # convert --to-hf writes the llama3 scaling


def test_rope_freqs_of_ones_are_no_scaling():
    assert config_from_gguf_metadata(GGUF, (1.0,) * 32).rope_scaling is None


def test_rope_freqs_that_no_llama3_scaling_gives_cannot_become_config_json():
    config = config_from_gguf_metadata(GGUF, tuple(1.0 + i / 8 for i in range(32)))  # a line, not llama3's curve
    with pytest.raises(ModelLoadError, match="not a llama3 rope scaling"):
        to_hf_dict(config)
    with pytest.raises(ModelLoadError, match="fewer than two frequencies in its blended band"):
        llama3_from_factors((1.0,) * 16 + (8.0,) * 16, 10000.0)
    with pytest.raises(ModelLoadError, match="not a llama3 rope scaling"):  # falling: the band's line slopes upwards
        llama3_from_factors((1.0,) * 8 + tuple(8.0 - i / 4 for i in range(16)) + (8.0,) * 8, 10000.0)
