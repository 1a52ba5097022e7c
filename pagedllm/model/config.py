"""ModelConfig: the hyperparameters of a Llama-family decoder, read from an HF config.json or GGUF metadata."""

from dataclasses import dataclass, field
from typing import Any

from pagedllm.errors import ModelLoadError

# HF model_type / GGUF general.architecture -> whether q/k/v projections carry biases by default.
SUPPORTED_ARCHITECTURES: dict[str, bool] = {"llama": False, "mistral": False, "qwen2": True}


@dataclass(slots=True, frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.low_freq_factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
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
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
            raise ModelLoadError(f"unsupported architecture {self.architecture!r}; supported: {supported}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ModelLoadError(f"head_dim must be positive and even, got {self.head_dim}")

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """From a transformers config.json dict (v4 `rope_theta`/`rope_scaling` or v5 `rope_parameters`)."""
        arch = _hf_architecture(cfg)
        try:
            num_heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
                head_dim=int(cfg.get("head_dim") or hidden // num_heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                rope_scaling=_rope_scaling(rope),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", SUPPORTED_ARCHITECTURES[arch])),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=_as_list(cfg.get("eos_token_id")),
            )
        except KeyError as exc:
            raise ModelLoadError(f"config.json lacks required key {exc.args[0]!r}") from None

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
        return out


def _hf_architecture(cfg: dict[str, Any]) -> str:
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ModelLoadError("config.json has no model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ModelLoadError(f"unsupported architecture {model_type!r} in config.json; supported: {supported}")
    return str(model_type)


def _rope_scaling(rope: dict[str, Any]) -> RopeScaling | None:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("default", None) or not rope:
        return None
    if kind != "llama3":
        raise ModelLoadError(f"unsupported rope scaling type {kind!r}; supported: default, llama3")
    return RopeScaling(
        factor=float(rope["factor"]),
        low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
    )


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def config_from_gguf_metadata(meta: dict[str, Any]) -> ModelConfig:
    """From GGUF key/values (already decoded to Python values), e.g. `llama.block_count`."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {supported}")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return value

    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ModelLoadError(f"unsupported GGUF rope scaling {scaling!r}")
    num_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=int(get("attention.key_length", hidden // num_heads)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=int(get("context_length", 2048)),
        tie_word_embeddings=False,  # the loader sets this when the file has no output.weight
        attention_bias=SUPPORTED_ARCHITECTURES[arch],
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_as_list(eos),
    )
