"""Engine configuration, validated once at construction."""

import re
from dataclasses import dataclass

from pagedllm.errors import InvalidInputError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_memory_size(text: str | int) -> int:
    """'2GiB', '512MiB', '1.5G' or a plain byte count -> bytes (binary units)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise InvalidInputError(f"cannot read memory size {text!r}; use e.g. '2GiB' or '512MiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


@dataclass(slots=True)
class EngineConfig:
    model: str | None = None  # HF directory or GGUF file; None = the built-in default model
    dtype: str = "float32"  # "float32" or "bfloat16"
    block_size: int = 16
    kv_cache_memory: str | int = "2GiB"  # budget for the KV pool; ignored when num_blocks is set
    num_blocks: int | None = None
    max_num_seqs: int = 64  # running sequences per step
    max_num_batched_tokens: int = 1024  # token budget per step (prefill chunks + decodes)
    max_model_len: int | None = None  # default: the model's max_position_embeddings, capped at 8192
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"  # or "swap"
    allocator: str = "paged"  # "contiguous": admit only with a max-length contiguous reservation (baseline)
    attention_impl: str = "auto"
    served_model_name: str | None = None
    max_n: int = 16  # largest n / beam width a request may ask for
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16"):
            raise InvalidInputError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        _require_positive("block_size", self.block_size)
        _require_positive("max_num_seqs", self.max_num_seqs)
        _require_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _require_positive("max_n", self.max_n)
        if self.num_blocks is not None:
            _require_positive("num_blocks", self.num_blocks)
        if self.max_model_len is not None:
            _require_positive("max_model_len", self.max_model_len)
        if parse_memory_size(self.kv_cache_memory) <= 0:
            raise InvalidInputError("kv_cache_memory must be positive")
        if self.allocator not in ("paged", "contiguous"):
            raise InvalidInputError(f"allocator must be 'paged' or 'contiguous', got {self.allocator!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise InvalidInputError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")


def _require_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
