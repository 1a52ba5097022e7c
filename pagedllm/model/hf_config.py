"""ModelConfig from a transformers config.json dict (v4's rope_theta / rope_scaling or v5's rope_parameters) and
back: what transformers reads, with its defaults, and a refusal for what pagedllm cannot run."""

from typing import Any

from pagedllm.errors import ModelLoadError
from pagedllm.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from pagedllm.model.config_reader import ConfigReader
from pagedllm.model.rope import Llama3Rope, LinearRope, RopeScaling, YarnRope, yarn_attention_factor

# transformers' defaults where a config.json leaves these out.
_HF_RMS_NORM_EPS = 1e-6
_HF_MAX_POSITIONS = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768}
_HF_HEAD_DIM = {"qwen3": 128}  # Qwen3Config's; the others' is hidden_size / num_attention_heads
_HF_SLIDING_WINDOW = 4096


def from_hf_dict(cfg: dict[str, Any]) -> ModelConfig:
    """From a transformers config.json dict (v4 `rope_theta`/`rope_scaling` or v5 `rope_parameters`)."""
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"config.json must hold a JSON object, got {type(cfg).__name__}")
    arch = _hf_architecture(cfg)
    read = ConfigReader(cfg, "config.json")
    _refuse_unsupported_hf(cfg, arch, read)
    num_heads, hidden = read.int("num_attention_heads"), read.int("hidden_size")
    num_layers = read.int("num_hidden_layers")
    sliding_window, max_window_layers = _hf_sliding_window(cfg, arch, num_layers, read)
    rope = _hf_rope(cfg)
    max_positions = read.int("max_position_embeddings", _HF_MAX_POSITIONS[arch])
    return ModelConfig(
        architecture=arch,
        vocab_size=read.int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=read.int("intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=read.int("num_key_value_heads", num_heads) or num_heads,
        head_dim=read.int("head_dim", _HF_HEAD_DIM.get(arch, hidden // max(num_heads, 1))),
        rms_norm_eps=read.float("rms_norm_eps", _HF_RMS_NORM_EPS),
        rope_theta=ConfigReader(rope, "config.json rope parameters").float("rope_theta", 10000.0),
        rope_scaling=_rope_scaling(rope, max_positions),
        max_position_embeddings=max_positions,
        tie_word_embeddings=read.bool("tie_word_embeddings", False),
        attention_bias=SUPPORTED_ARCHITECTURES[arch],
        sliding_window=sliding_window,
        max_window_layers=max_window_layers,
        bos_token_id=read.int("bos_token_id", None),
        eos_token_ids=read.int_list("eos_token_id"),
    )


def to_hf_dict(config: ModelConfig) -> dict[str, Any]:
    """A config.json that transformers (and vLLM) load as the matching HF architecture."""
    hf_class = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM"}  # fmt: skip
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        rope = {**config.rope_scaling.hf_parameters(config.rope_theta), "rope_theta": config.rope_theta}
    out: dict[str, Any] = {
        "architectures": [hf_class[config.architecture]],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": rope,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids[0] if len(config.eos_token_ids) == 1 else config.eos_token_ids or None,
    }
    if config.architecture in ("llama", "qwen3"):
        out["attention_bias"] = config.attention_bias
    if config.architecture == "mistral":
        out["sliding_window"] = config.sliding_window  # null: none (absent, transformers would assume 4096)
    if config.architecture in ("qwen2", "qwen3"):
        out["use_sliding_window"] = config.sliding_window is not None
        out["sliding_window"] = config.sliding_window
        out["max_window_layers"] = config.max_window_layers if config.sliding_window is not None else config.num_layers
    return out


def _hf_architecture(cfg: dict[str, Any]) -> str:
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ModelLoadError("config.json has no model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ModelLoadError(f"unsupported architecture {model_type!r} in config.json; supported: {supported}")
    return model_type


def _refuse_unsupported_hf(cfg: dict[str, Any], arch: str, read: ConfigReader) -> None:
    """What transformers would honour and this engine cannot: refused, never silently ignored."""
    quantization = cfg.get("quantization_config")
    if quantization is not None:
        method = quantization.get("quant_method", "unnamed") if isinstance(quantization, dict) else quantization
        raise ModelLoadError(f"config.json: quantized checkpoints (quantization_config {method!r}) are not supported")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ModelLoadError(f"config.json: unsupported hidden_act {cfg['hidden_act']!r}; supported: silu")
    if arch == "qwen3" and read.bool("attention_bias", False):
        raise ModelLoadError("config.json: attention_bias is not supported for qwen3 (its o_proj bias)")
    if arch != "llama":  # transformers' Qwen2, Qwen3 and Mistral build their layers without reading the others
        return
    if read.bool("mlp_bias", False):
        raise ModelLoadError("config.json: mlp_bias is not supported (the MLP's projections have no biases)")
    if read.bool("attention_bias", False):
        raise ModelLoadError("config.json: attention_bias is not supported for llama (its o_proj bias)")


def _hf_sliding_window(cfg: dict[str, Any], arch: str, num_layers: int, read: ConfigReader) -> tuple[int | None, int]:
    """(window, first layer with it), as transformers reads them: `layer_types` where given, else Mistral's
    `sliding_window` on every layer, Qwen2's on the layers from `max_window_layers` on when `use_sliding_window`."""
    layer_types = cfg.get("layer_types")
    if arch == "llama":  # transformers' Llama has no sliding window
        return None, 0
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ModelLoadError(f"config.json: layer_types must list the {num_layers} layers' kinds")
        first = next((i for i, kind in enumerate(layer_types) if kind == "sliding_attention"), num_layers)
        if any(kind not in ("full_attention", "sliding_attention") for kind in layer_types) or any(
                kind != "sliding_attention" for kind in layer_types[first:]):
            raise ModelLoadError(f"config.json: unsupported layer_types {layer_types} (supported: full attention "
                                 "layers, then sliding window layers)")
    elif arch == "mistral":
        first = 0
    elif read.bool("use_sliding_window", False):  # qwen2, qwen3
        first = read.int("max_window_layers", 28)  # transformers' default
    else:
        first = num_layers
    if first >= num_layers:
        return None, 0
    # transformers' default where the key is absent; null means none
    window = read.int("sliding_window", None) if "sliding_window" in cfg else _HF_SLIDING_WINDOW
    return window, first if window is not None else 0


def _hf_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope settings of transformers v5's rope_parameters, v4's rope_scaling and the top-level rope_theta
    together; a config where two of them give one setting different values is refused."""
    rope: dict[str, Any] = {}
    for source in ("rope_parameters", "rope_scaling"):
        settings = cfg.get(source)
        if settings is None:
            continue
        if not isinstance(settings, dict):
            raise ModelLoadError(f"config.json: {source} must be an object, got {settings!r}")
        _merge_rope(rope, {**settings, "rope_type": _rope_kind(settings)})
    if cfg.get("rope_theta") is not None:
        _merge_rope(rope, {"rope_theta": cfg["rope_theta"]})
    return rope


def _merge_rope(rope: dict[str, Any], settings: dict[str, Any]) -> None:
    for name, value in settings.items():
        if name == "type":  # v4's name, given as rope_type
            continue
        if name in rope and rope[name] != value:
            raise ModelLoadError(f"config.json: the rope settings disagree on {name} ({rope[name]!r} vs {value!r})")
        rope[name] = value


def _rope_kind(rope: dict[str, Any]) -> str:
    kind = rope.get("rope_type", rope.get("type"))
    if kind is None:
        if "factor" in rope:
            raise ModelLoadError(f"config.json: rope scaling {rope} names no rope_type")
        return "default"
    return str(kind)


def _rope_scaling(rope: dict[str, Any], max_positions: int) -> RopeScaling | None:
    """As transformers reads them: a llama3 or yarn scaling without original_max_position_embeddings takes
    max_position_embeddings."""
    kind = _rope_kind(rope)
    if kind == "default":
        return None
    if kind not in ("linear", "llama3", "yarn"):
        raise ModelLoadError(f"unsupported rope scaling type {kind!r}; supported: default, linear, llama3, yarn")
    read = ConfigReader(rope, f"config.json {kind} rope scaling")
    if kind == "linear":
        return LinearRope(read.float("factor"))
    original = read.int("original_max_position_embeddings", max_positions)
    if kind == "llama3":
        return Llama3Rope(read.float("factor"), read.float("low_freq_factor"), read.float("high_freq_factor"),
                          original)  # fmt: skip
    factor = read.float("factor")
    default_attention = yarn_attention_factor(factor, read.float("mscale", None), read.float("mscale_all_dim", None))
    return YarnRope(factor, original, read.float("attention_factor", default_attention),
                    read.float("beta_fast", None) or 32.0, read.float("beta_slow", None) or 1.0,
                    read.bool("truncate", True))  # fmt: skip
