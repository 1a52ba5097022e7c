"""ModelConfig: the hyperparameters of a Llama-family decoder, read from an HF config.json or GGUF metadata."""

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedllm.checks import is_int
from pagedllm.errors import ModelLoadError

# HF model_type / GGUF general.architecture -> whether q/k/v projections carry biases (transformers' Qwen2
# always has them and Mistral never, whatever a config.json says; a Llama with them is refused).
SUPPORTED_ARCHITECTURES: dict[str, bool] = {"llama": False, "mistral": False, "qwen2": True}
# transformers' defaults where a config.json leaves these out.
_HF_RMS_NORM_EPS = 1e-6
_HF_MAX_POSITIONS = {"llama": 2048, "mistral": 131072, "qwen2": 32768}
_HF_SLIDING_WINDOW = 4096


@contextlib.contextmanager
def naming(file: Path) -> Iterator[None]:
    """A config error raised inside names the file it comes from (validation knows only the field)."""
    try:
        yield
    except ModelLoadError as exc:
        message = str(exc).removeprefix("model config: ").removeprefix("GGUF metadata: ")
        if file.name in message:
            raise ModelLoadError(message.replace(file.name, str(file), 1)) from None
        raise ModelLoadError(f"{file}: {message}") from None


@dataclass(slots=True, frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if (self.factor <= 0 or self.low_freq_factor <= 0 or self.high_freq_factor <= self.low_freq_factor
                or self.original_max_position_embeddings <= 0):
            raise ModelLoadError(f"invalid llama3 rope scaling {self}")


@dataclass(slots=True)
class ModelConfig:
    architecture: str  # "llama" | "mistral" | "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    # The attention window of the layers that have one (None: every layer attends to its whole context), and the
    # first such layer (Qwen2's max_window_layers; Mistral's are all). pagedllm attends to the whole context, which
    # is the same while a sequence fits the window: the engine keeps max_model_len within it.
    sliding_window: int | None = None
    max_window_layers: int = 0
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    # generation_config.json's sampling settings, as SamplingParams fields: the defaults of requests that leave
    # them out, as in vLLM (its max_new_tokens is max_tokens)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
            raise ModelLoadError(f"unsupported architecture {self.architecture!r}; supported: {supported}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "max_position_embeddings", "rms_norm_eps", "rope_theta"):
            if not getattr(self, name) > 0:  # NaN fails too
                raise ModelLoadError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ModelLoadError(f"head_dim must be positive and even, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ModelLoadError(f"model config: sliding_window must be positive, got {self.sliding_window}")
        if self.sliding_window is not None and not 0 <= self.max_window_layers < self.num_layers:
            raise ModelLoadError(f"model config: max_window_layers {self.max_window_layers} leaves no layer its "
                                 f"sliding window among {self.num_layers}")

    @property
    def context_limit(self) -> int:
        """The longest sequence pagedllm runs this model for: its max_position_embeddings, and within a sliding
        window where it has one (pagedllm's attention has no window)."""
        return min(self.max_position_embeddings, self.sliding_window or self.max_position_embeddings)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """From a transformers config.json dict (v4 `rope_theta`/`rope_scaling` or v5 `rope_parameters`)."""
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"config.json must hold a JSON object, got {type(cfg).__name__}")
        arch = _hf_architecture(cfg)
        read = _Reader(cfg, "config.json")
        _refuse_unsupported_hf(cfg, arch, read)
        num_heads, hidden = read.int("num_attention_heads"), read.int("hidden_size")
        num_layers = read.int("num_hidden_layers")
        sliding_window, max_window_layers = _hf_sliding_window(cfg, arch, num_layers)
        rope = _hf_rope(cfg)
        return cls(
            architecture=arch,
            vocab_size=read.int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=read.int("intermediate_size"),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=read.int("num_key_value_heads", num_heads) or num_heads,
            head_dim=read.int("head_dim", hidden // max(num_heads, 1)),
            rms_norm_eps=read.float("rms_norm_eps", _HF_RMS_NORM_EPS),
            rope_theta=_Reader(rope, "config.json rope parameters").float("rope_theta", 10000.0),
            rope_scaling=_rope_scaling(rope),
            max_position_embeddings=read.int("max_position_embeddings", _HF_MAX_POSITIONS[arch]),
            tie_word_embeddings=read.bool("tie_word_embeddings", False),
            attention_bias=SUPPORTED_ARCHITECTURES[arch],
            sliding_window=sliding_window,
            max_window_layers=max_window_layers,
            bos_token_id=read.int("bos_token_id", None),
            eos_token_ids=read.int_list("eos_token_id"),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that transformers (and vLLM) load as the matching HF architecture."""
        hf_class = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            s = self.rope_scaling
            rope = {"rope_type": "llama3", "rope_theta": self.rope_theta, "factor": s.factor,
                    "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                    "original_max_position_embeddings": s.original_max_position_embeddings}  # fmt: skip
        out: dict[str, Any] = {
            "architectures": [hf_class[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids or None,
        }
        if self.architecture == "llama":
            out["attention_bias"] = self.attention_bias
        if self.architecture == "mistral":
            out["sliding_window"] = self.sliding_window  # null: none (absent, transformers would assume 4096)
        if self.architecture == "qwen2":
            out["use_sliding_window"] = self.sliding_window is not None
            out["sliding_window"] = self.sliding_window
            out["max_window_layers"] = self.max_window_layers if self.sliding_window is not None else self.num_layers
        return out


_REQUIRED = object()  # a _Reader default: the field must be given


class _Reader:
    """Typed reads of a config's fields: a value of the wrong type is a ModelLoadError naming the field.
    A field given as null counts as not given."""

    def __init__(self, fields: dict[str, Any], source: str) -> None:
        self.fields, self.source = fields, source

    def _get(self, key: str, default: Any) -> Any:
        value = self.fields.get(key)
        if value is not None:
            return value
        if default is _REQUIRED:
            raise ModelLoadError(f"{self.source} lacks required key {key!r}")
        return default

    def _wrong(self, key: str, value: Any, kind: str) -> ModelLoadError:
        return ModelLoadError(f"{self.source}: {key} must be {kind}, got {value!r}")

    def int(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self._get(key, default)
        if value is not default and not is_int(value):
            raise self._wrong(key, value, "an integer")
        return value

    def float(self, key: str, default: Any = _REQUIRED) -> float:
        value = self._get(key, default)
        if not (is_int(value) or isinstance(value, float)) or not math.isfinite(value):
            raise self._wrong(key, value, "a finite number")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._wrong(key, value, "true or false")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self._get(key, [])
        values = value if isinstance(value, list) else [value]
        if not all(map(is_int, values)):
            raise self._wrong(key, value, "an integer or a list of integers")
        return values


def _hf_architecture(cfg: dict[str, Any]) -> str:
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ModelLoadError("config.json has no model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ModelLoadError(f"unsupported architecture {model_type!r} in config.json; supported: {supported}")
    return model_type


def _refuse_unsupported_hf(cfg: dict[str, Any], arch: str, read: "_Reader") -> None:
    """What transformers would honour and this engine cannot: refused, never silently ignored."""
    quantization = cfg.get("quantization_config")
    if quantization is not None:
        method = quantization.get("quant_method", "unnamed") if isinstance(quantization, dict) else quantization
        raise ModelLoadError(f"config.json: quantized checkpoints (quantization_config {method!r}) are not supported")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ModelLoadError(f"config.json: unsupported hidden_act {cfg['hidden_act']!r}; supported: silu")
    if arch != "llama":  # transformers' Qwen2 and Mistral build their layers without reading these keys
        return
    if read.bool("mlp_bias", False):
        raise ModelLoadError("config.json: mlp_bias is not supported (the MLP's projections have no biases)")
    if read.bool("attention_bias", False):
        raise ModelLoadError("config.json: attention_bias is not supported for llama (its o_proj bias)")


def _hf_sliding_window(cfg: dict[str, Any], arch: str, num_layers: int) -> tuple[int | None, int]:
    """(window, first layer with it), as transformers reads them: `layer_types` where given, else Mistral's
    `sliding_window` on every layer, Qwen2's on the layers from `max_window_layers` on when `use_sliding_window`."""
    read = _Reader(cfg, "config.json")
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
    elif read.bool("use_sliding_window", False):  # qwen2
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


def _rope_scaling(rope: dict[str, Any]) -> RopeScaling | None:
    kind = _rope_kind(rope)
    if kind == "default":
        return None
    if kind != "llama3":
        raise ModelLoadError(f"unsupported rope scaling type {kind!r}; supported: default, llama3")
    read = _Reader(rope, "config.json llama3 rope scaling")
    return RopeScaling(
        factor=read.float("factor"),
        low_freq_factor=read.float("low_freq_factor"),
        high_freq_factor=read.float("high_freq_factor"),
        original_max_position_embeddings=read.int("original_max_position_embeddings"),
    )


def config_from_gguf_metadata(meta: dict[str, Any]) -> ModelConfig:
    """From GGUF key/values (already decoded to Python values), e.g. `llama.block_count`."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {supported}")

    read = _Reader(meta, "GGUF metadata")
    _check_gguf_rope(meta, arch)
    num_heads = read.int(f"{arch}.attention.head_count")
    hidden = read.int(f"{arch}.embedding_length")
    head_dim = read.int(f"{arch}.attention.key_length", hidden // max(num_heads, 1))
    if read.int(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ModelLoadError(f"GGUF metadata: rotary over {meta[f'{arch}.rope.dimension_count']} of the head's "
                             f"{head_dim} dimensions is not supported")
    return ModelConfig(
        architecture=arch,
        vocab_size=read.int(f"{arch}.vocab_size", len(meta.get("tokenizer.ggml.tokens") or [])),
        hidden_size=hidden,
        intermediate_size=read.int(f"{arch}.feed_forward_length"),
        num_layers=read.int(f"{arch}.block_count"),
        num_heads=num_heads,
        num_kv_heads=read.int(f"{arch}.attention.head_count_kv", num_heads),
        head_dim=head_dim,
        rms_norm_eps=read.float(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=read.float(f"{arch}.rope.freq_base", 10000.0),
        max_position_embeddings=read.int(f"{arch}.context_length", 2048),
        tie_word_embeddings=False,  # the loader sets this when the file has no output.weight
        attention_bias=SUPPORTED_ARCHITECTURES[arch],
        sliding_window=read.int(f"{arch}.attention.sliding_window", None),
        bos_token_id=read.int("tokenizer.ggml.bos_token_id", None),
        eos_token_ids=read.int_list("tokenizer.ggml.eos_token_id"),
    )


def _check_gguf_rope(meta: dict[str, Any], arch: str) -> None:
    """No rope scaling: llama.cpp takes a scaling factor without a type as linear scaling, which pagedllm has not."""
    read = _Reader(meta, "GGUF metadata")
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ModelLoadError(f"unsupported GGUF rope scaling {scaling!r}")
    for key in (f"{arch}.rope.scaling.factor", f"{arch}.rope.scale_linear"):
        factor = read.float(key, 1.0)
        if scaling is None and factor not in (0.0, 1.0):  # llama.cpp reads 0 as "not set"
            raise ModelLoadError(f"unsupported GGUF rope scaling: {key} = {factor} (linear scaling)")
