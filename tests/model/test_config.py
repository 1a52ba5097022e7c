"""ModelConfig from HF config dicts (transformers v4 and v5 spellings) and GGUF metadata."""

import pytest

from pagedllm.errors import ModelLoadError
from pagedllm.model.config import ModelConfig
from pagedllm.model.gguf_config import config_from_gguf_metadata
from pagedllm.model.hf_config import from_hf_dict, to_hf_dict
from pagedllm.model.rope import Llama3Rope

BASE = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4}  # fmt: skip
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip


def test_defaults_fill_in_mha_and_head_dim():
    config = from_hf_dict(BASE)
    assert (config.num_kv_heads, config.head_dim, config.attention_bias) == (4, 16, False)


def test_v4_and_v5_rope_spellings_agree():
    v4 = from_hf_dict({**BASE, "rope_theta": 5e5, "rope_scaling": LLAMA3})
    v5 = from_hf_dict({**BASE, "rope_parameters": {**LLAMA3, "rope_theta": 5e5}})
    assert v4 == v5
    assert v4.rope_theta == 5e5 and v4.rope_scaling == Llama3Rope(8.0, 1.0, 4.0, 8192)


def test_qwen2_has_biases_and_eos_list():
    config = from_hf_dict({**BASE, "model_type": "qwen2", "eos_token_id": [7, 8]})
    assert config.attention_bias and config.eos_token_ids == [7, 8]


def test_round_trip_through_hf_dict():
    config = from_hf_dict({**BASE, "num_key_value_heads": 1, "rope_scaling": LLAMA3, "eos_token_id": 2})
    assert from_hf_dict(to_hf_dict(config)) == config


@pytest.mark.parametrize(
    "change,message",
    [({"model_type": "gpt2"}, "unsupported architecture"), ({"num_key_value_heads": 3}, "not a multiple"),
     ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "unsupported rope scaling type 'dynamic'"),
     ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "unsupported rope scaling type 'longrope'"),
     ({"rope_scaling": {"rope_type": "linear", "factor": 0.5}}, "factor of at least 1"),
     ({"rope_scaling": {"rope_type": "linear"}}, "linear rope scaling lacks required key 'factor'"),
     ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": -1}}, "invalid yarn rope scaling"),
     ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": "1"}}, "mscale must be a finite number"),
     ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": 1}}, "truncate must be true or false"),
     ({"hidden_act": "gelu"}, "unsupported hidden_act 'gelu'"),
     ({"rope_theta": 0}, "rope_theta must be positive"), ({"rope_theta": -1.0}, "rope_theta must be positive"),
     ({"rms_norm_eps": -1}, "rms_norm_eps must be positive"), ({"rms_norm_eps": float("nan")}, "finite number"),
     ({"max_position_embeddings": 0}, "max_position_embeddings must be positive"),
     ({"rope_scaling": {**LLAMA3, "original_max_position_embeddings": 0}}, "invalid llama3 rope scaling"),
     ({"rope_parameters": {"factor": 4.0}}, "names no rope_type"),
     ({"rope_parameters": {"rope_type": "default"}, "rope_scaling": LLAMA3}, "disagree on rope_type"),
     ({"rope_parameters": LLAMA3, "rope_scaling": {**LLAMA3, "factor": 4.0}}, "disagree on factor .8.0 vs 4.0."),
     ({"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}, "rope_theta": 1e4}, "disagree on rope_theta"),
     ({"quantization_config": {"quant_method": "fp8"}}, "quantized checkpoints .quantization_config 'fp8'."),
     ({"rope_parameters": [1]}, "rope_parameters must be an object"),
     ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
     ({"attention_bias": 0}, "attention_bias must be true or false"),
     ({"vocab_size": "100"}, "vocab_size must be an integer, got '100'"),
     ({"head_dim": 16.5}, "head_dim must be an integer"),
     ({"intermediate_size": 128.0}, "intermediate_size must be an integer"),
     ({"num_attention_heads": 0}, "num_heads must be positive"),
     ({"eos_token_id": "2"}, "eos_token_id must be an integer"),
     ({"bos_token_id": "abc"}, "bos_token_id must be an integer"),
     ({"rope_scaling": {**LLAMA3, "factor": "8"}}, "factor must be a finite number"),
     ({"model_type": ["llama"]}, "unsupported architecture"),
     ({"mlp_bias": True}, "mlp_bias is not supported"), ({"attention_bias": True}, "attention_bias is not supported"),
     ({"model_type": "mistral", "sliding_window": 0}, "sliding_window must be positive"),
     ({"model_type": "qwen2", "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8},
      "unsupported layer_types"),
     ({"model_type": "mistral", "layer_types": ["full_attention"]}, "must list the 2 layers")],
)  # fmt: skip
def test_invalid_configs(change, message):
    with pytest.raises(ModelLoadError, match=message):
        from_hf_dict({**BASE, **change})


@pytest.mark.parametrize("value", [[], None, "llama", 3])
def test_a_config_that_is_not_an_object_is_refused(value):
    with pytest.raises(ModelLoadError, match="must hold a JSON object"):
        from_hf_dict(value)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_left_out_fields_take_transformers_defaults(arch):
    from transformers import AutoConfig

    hf = AutoConfig.for_model(arch, **{k: v for k, v in BASE.items() if k != "model_type"})
    config = from_hf_dict({**BASE, "model_type": arch})
    assert (config.rms_norm_eps, config.max_position_embeddings) == (hf.rms_norm_eps, hf.max_position_embeddings)
    assert config.head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)


def test_qwen3_norms_q_and_k_and_refuses_attention_biases():
    config = from_hf_dict({**BASE, "model_type": "qwen3"})
    assert config.qk_norm and not config.attention_bias and config.head_dim == 128
    assert from_hf_dict(to_hf_dict(config)) == config
    assert not from_hf_dict(BASE).qk_norm
    with pytest.raises(ModelLoadError, match="attention_bias is not supported for qwen3"):
        from_hf_dict({**BASE, "model_type": "qwen3", "attention_bias": True})


@pytest.mark.parametrize("arch,fields", [
    ("qwen2", {"attention_bias": False, "mlp_bias": True}), ("mistral", {"attention_bias": True, "mlp_bias": True}),
    ("llama", {"hidden_act": "swish"}),
])  # fmt: skip
def test_keys_transformers_ignores_are_ignored(arch, fields):
    """Qwen2's q/k/v always have biases and Mistral's never, neither MLP has any, and swish is SiLU's other name."""
    config = from_hf_dict({**BASE, "model_type": arch, **fields})
    assert config.attention_bias == (arch == "qwen2")


def test_the_same_rope_setting_in_several_places_is_read_once():
    config = from_hf_dict({**BASE, "rope_theta": 5e5, "rope_scaling": {**LLAMA3, "type": "llama3"},
                                       "rope_parameters": {**LLAMA3, "rope_theta": 500000}})  # fmt: skip
    assert config.rope_theta == 5e5 and config.rope_scaling == Llama3Rope(8.0, 1.0, 4.0, 8192)


def test_null_optional_fields_take_their_defaults():
    config = from_hf_dict({**BASE, "head_dim": None, "num_key_value_heads": None, "rope_scaling": None})
    assert (config.head_dim, config.num_kv_heads, config.rope_scaling) == (16, 4, None)


@pytest.mark.parametrize("fields,window,first", [
    ({"model_type": "mistral", "sliding_window": 16}, 16, 0),
    ({"model_type": "mistral"}, 4096, 0),  # transformers' MistralConfig default
    ({"model_type": "mistral", "sliding_window": None}, None, 0),
    ({"model_type": "qwen2", "sliding_window": 16}, None, 0),  # use_sliding_window is off by default
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}, 16, 1),
    ({"model_type": "qwen3", "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}, 16, 1),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}, None, 0),
    ({"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 1}, 4096, 1),  # Qwen2Config default
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": None, "max_window_layers": 1}, None, 0),
    ({"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8}, 8, 1),
    ({"layer_types": ["sliding_attention"] * 2, "sliding_window": 8}, None, 0),  # transformers' Llama has none
])  # fmt: skip
def test_sliding_windows_as_transformers_reads_them(fields, window, first):
    config = from_hf_dict({**BASE, **fields})
    assert (config.sliding_window, config.max_window_layers) == (window, first)
    assert config.context_limit == min(config.max_position_embeddings, window or config.max_position_embeddings)
    assert from_hf_dict(to_hf_dict(config)) == config  # convert --to-hf keeps it


def test_missing_key():
    with pytest.raises(ModelLoadError, match="'hidden_size'"):
        from_hf_dict({k: v for k, v in BASE.items() if k != "hidden_size"})


def test_from_gguf_metadata():
    meta = {"general.architecture": "llama", "llama.block_count": 30, "llama.embedding_length": 576,
            "llama.feed_forward_length": 1536, "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3,
            "llama.rope.freq_base": 1e5, "tokenizer.ggml.tokens": range(49152), "tokenizer.ggml.eos_token_id": 2}  # fmt: skip
    config = config_from_gguf_metadata(meta)
    assert (config.vocab_size, config.head_dim, config.num_kv_heads, config.eos_token_ids) == (49152, 64, 3, [2])
    with pytest.raises(ModelLoadError, match="lacks required key 'llama.block_count'"):
        config_from_gguf_metadata({k: v for k, v in meta.items() if k != "llama.block_count"})


@pytest.mark.parametrize("change,message", [
    ({"llama.attention.head_count": 0}, "num_heads must be positive"),
    ({"llama.block_count": "30"}, "llama.block_count must be an integer"),
    ({"llama.attention.head_count": [9, 9]}, "head_count must be an integer"),
    ({"tokenizer.ggml.eos_token_id": "2"}, "eos_token_id must be an integer"),
    ({"llama.rope.freq_base": 0.0}, "rope_theta must be positive"),
    ({"llama.attention.layer_norm_rms_epsilon": -1.0}, "rms_norm_eps must be positive"),
    ({"llama.context_length": 0}, "max_position_embeddings must be positive"),
    ({"llama.rope.dimension_count": 32}, "rotary over 32 of the head's 64 dimensions"),
])  # fmt: skip
def test_invalid_gguf_metadata(change, message):
    meta = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 576,
            "llama.feed_forward_length": 1536, "llama.attention.head_count": 9,
            "tokenizer.ggml.tokens": range(100)}  # fmt: skip
    with pytest.raises(ModelLoadError, match=message):
        config_from_gguf_metadata({**meta, **change})


GGUF = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 576,
        "llama.feed_forward_length": 1536, "llama.attention.head_count": 9, "tokenizer.ggml.tokens": range(100)}


@pytest.mark.parametrize("layers,window,first", [(2, None, 0), (30, 16, 28)])
def test_qwen2_sliding_window_starts_at_transformers_default_max_window_layers(layers, window, first):
    """Qwen2Config's max_window_layers defaults to 28: a 2-layer model has no windowed layer, a 30-layer one
    has them from layer 28 on."""
    config = from_hf_dict({**BASE, "model_type": "qwen2", "num_hidden_layers": layers, "use_sliding_window": True,
                           "sliding_window": 16})
    assert (config.sliding_window, config.max_window_layers) == (window, first)


def test_gguf_without_head_count_kv_is_multi_head():
    """llama.cpp reads a missing head_count_kv as head_count (MHA)."""
    assert config_from_gguf_metadata(GGUF).num_kv_heads == 9


def test_gguf_defaults_for_left_out_keys():
    config = config_from_gguf_metadata(GGUF)
    assert (config.rms_norm_eps, config.rope_theta, config.max_position_embeddings) == (1e-5, 10000.0, 2048)
    assert config.bos_token_id is None and config.eos_token_ids == []


def test_gguf_sliding_window_is_read_and_limits_the_context():
    config = config_from_gguf_metadata({**GGUF, "llama.attention.sliding_window": 64,
                                        "llama.context_length": 4096})
    assert config.sliding_window == 64 and config.context_limit == 64


@pytest.mark.parametrize("extra", [{"llama.rope.scaling.type": "none"},
                                   {"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 1.0},
                                   {"llama.rope.scaling.factor": 0.0}, {"llama.rope.scale_linear": 0.0},
                                   {"llama.rope.scaling.factor": 1.0}])
def test_gguf_rope_without_scaling_loads(extra):
    """scaling.type "none", and a factor of 1 or 0 (llama.cpp's "not set"), mean no scaling."""
    assert config_from_gguf_metadata({**GGUF, **extra}).rope_scaling is None


def test_gguf_bos_token_id_is_read():
    assert config_from_gguf_metadata({**GGUF, "tokenizer.ggml.bos_token_id": 1}).bos_token_id == 1


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_left_out_rope_theta_and_tie_take_transformers_defaults(arch):
    from transformers import AutoConfig

    hf = AutoConfig.for_model(arch)
    theta = hf.rope_parameters["rope_theta"] if getattr(hf, "rope_parameters", None) else hf.rope_theta
    config = from_hf_dict({**BASE, "model_type": arch})
    assert (config.rope_theta, config.tie_word_embeddings) == (theta, hf.tie_word_embeddings) == (10000.0, False)


@pytest.mark.parametrize("change,message", [({"num_key_value_heads": True}, "num_key_value_heads must be an integer"),
                                            ({"rms_norm_eps": True}, "rms_norm_eps must be a finite number"),
                                            ({"eos_token_id": [2, False]}, "eos_token_id must be an integer")])
def test_booleans_are_not_numbers_in_a_config(change, message):
    with pytest.raises(ModelLoadError, match=message):
        from_hf_dict({**BASE, **change})


def test_an_empty_quantization_config_is_still_refused():
    """transformers treats any quantization_config as a quantized checkpoint (pre_quantized)."""
    with pytest.raises(ModelLoadError, match="quantized checkpoints"):
        from_hf_dict({**BASE, "quantization_config": {}})


MODEL = dict(architecture="llama", vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
             num_kv_heads=2, head_dim=16)

def test_llama3_scaling_with_equal_low_and_high_freq_factors_is_refused():
    """high_freq_factor == low_freq_factor divides by zero in the smoothing band."""
    with pytest.raises(ModelLoadError, match="invalid llama3 rope scaling"):
        Llama3Rope(8.0, 2.0, 2.0, 8192)
    with pytest.raises(ModelLoadError, match="invalid llama3 rope scaling"):
        Llama3Rope(0.0, 1.0, 4.0, 8192)


def test_odd_head_dim_is_refused():
    with pytest.raises(ModelLoadError, match="head_dim must be positive and even"):
        from_hf_dict({**BASE, "head_dim": 15})


@pytest.mark.parametrize("name", ["rope_theta", "rms_norm_eps"])
def test_nan_model_settings_are_refused(name):
    with pytest.raises(ModelLoadError, match=f"{name} must be positive"):
        ModelConfig(**MODEL, **{name: float("nan")})


def test_a_sliding_window_needs_a_layer_that_has_it():
    ModelConfig(**MODEL, sliding_window=8, max_window_layers=1)
    with pytest.raises(ModelLoadError, match="leaves no layer"):
        ModelConfig(**MODEL, sliding_window=8, max_window_layers=2)

