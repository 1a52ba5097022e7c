"""ModelConfig: the hyperparameters of a Llama-family decoder (read from an HF config.json by hf_config.py, from GGUF
metadata by gguf_config.py)."""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedllm.errors import ModelLoadError
from pagedllm.model.rope import LinearRope, RopeScaling

# HF model_type / GGUF general.architecture -> whether q/k/v projections carry biases (transformers' Qwen2
# always has them and Mistral never, whatever a config.json says; a Llama or Qwen3 with them is refused).
SUPPORTED_ARCHITECTURES: dict[str, bool] = {"llama": False, "mistral": False, "qwen2": True, "qwen3": False}
# those whose q and k go through an RMSNorm over each head before the rotary
QK_NORM_ARCHITECTURES = ("qwen3",)


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


@dataclass(slots=True)
class ModelConfig:
    architecture: str  # "llama" | "mistral" | "qwen2" | "qwen3"
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
        """The longest sequence pagedllm runs this model for: its max_position_embeddings (times the factor of a
        linear rope scaling, as vLLM derives it), and within a sliding window where it has one (pagedllm's attention
        has no window)."""
        positions = self.max_position_embeddings
        if isinstance(self.rope_scaling, LinearRope):
            positions = int(positions * self.rope_scaling.factor)
        return min(positions, self.sliding_window or positions)

    @property
    def qk_norm(self) -> bool:
        """Whether each head's q and k are RMS-normed before the rotary (Qwen3)."""
        return self.architecture in QK_NORM_ARCHITECTURES

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None
