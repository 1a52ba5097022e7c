"""Engine configuration, validated once at construction."""

import json
import math
import os
import re
from dataclasses import dataclass, field

from pagedllm.checks import is_int
from pagedllm.errors import InvalidInputError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*\d+(?:\.\d+)?\s*$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_memory_size(text: str | int) -> int:
    """'2GiB', '512MiB', '1.5G' or a plain byte count -> bytes (binary units)."""
    if is_int(text):
        return text
    match = _SIZE.match(text) if isinstance(text, str) else None
    if not match:
        raise InvalidInputError(f"cannot read memory size {text!r}; use e.g. '2GiB' or '512MiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


DTYPES = ("auto", "float32", "bfloat16")
ALLOCATORS = ("paged", "contiguous")
PREEMPTION_MODES = ("recompute", "swap")
SCHEDULING_POLICIES = ("fcfs", "priority")
REASONING_PARSERS = ("deepseek_r1", "qwen3")  # both read a thinking model's <think> ... </think> block
REASONING_CONFIG_KEYS = ("reasoning_start_str", "reasoning_end_str")


def option(default, help: str, choices: tuple[str, ...] | None = None):
    """A config field whose default, help and choices are also its command-line option's (one place each)."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(slots=True)
class EngineConfig:
    """Every engine option. `LLM(**options)` takes these names; the commands take them as --kebab-case."""

    model: str | None = option(None, "HF directory or .gguf file (default: the built-in SmolLM2-135M-Instruct)")
    dtype: str = option(
        "auto", "weights and KV cache dtype; auto = bfloat16 where the CPU has native bf16, else float32", DTYPES
    )
    device: str = option("auto", "auto (CUDA when torch sees a GPU, else the CPU), cpu, cuda or cuda:N")
    block_size: int = option(16, "tokens per KV block")
    kv_cache_memory: str | int = option("2GiB", "memory for the KV pool, e.g. 2GiB; ignored when --num-blocks is set")
    num_blocks: int | None = option(None, "KV pool size in blocks (default: from --kv-cache-memory)")
    gpu_memory_utilization: float = option(
        0.9, "on CUDA: fraction of the GPU's memory for weights, activations and the KV pool (sizes the pool)"
    )
    max_num_seqs: int = option(64, "most sequences running in one step")
    max_num_batched_tokens: int = option(2048, "token budget of one step (prefill chunks + decodes)")
    max_model_len: int | None = option(None, "longest prompt + output (default: the model's, at most 8192)")
    enable_prefix_caching: bool = option(True, "reuse cached KV blocks of identical prompt prefixes")
    scheduling_policy: str = option(
        "fcfs", "fcfs: requests in arrival order; priority: by each request's priority (lower first), then arrival",
        SCHEDULING_POLICIES,
    )
    preemption_mode: str = option(
        "recompute", "what a preempted sequence's K/V become: recomputed later, or swapped out", PREEMPTION_MODES
    )
    swap_space: str | float = option(
        "4GiB", "with --preemption-mode swap: the most memory swapped-out K/V may take, per rank: GiB as a plain "
        "number (as vLLM's), or a size such as 512MiB; a sequence preempted past it is recomputed instead"
    )
    allocator: str = option(
        "paged", "contiguous: admit a request only with a max-length contiguous reservation (the baseline)", ALLOCATORS
    )
    attention_impl: str = option(
        "auto",
        "auto (CUDA: triton; CPU: compiled kernels where they build, else fast), compiled, fast, reference, "
        "blockwise or triton",
    )
    reasoning_parser: str | None = option(
        None, "a thinking model's reasoning tags (<think> ... </think>): the server splits its reasoning from its "
        "answer, and requests may limit it (thinking_token_budget)", REASONING_PARSERS,
    )
    reasoning_config: str | dict | None = option(
        None, 'vLLM\'s reasoning config, JSON: {"reasoning_start_str": ..., "reasoning_end_str": ...}: the strings '
        "that open a reasoning block and that a thinking_token_budget forces at its end (defaults: the reasoning "
        "parser's tags)",
    )
    served_model_name: str | None = option(None, "model name reported by the API (default: the file name)")
    max_n: int = option(16, "largest n / beam width a request may ask for")
    seed: int = option(0, "engine seed for requests without their own")
    enforce_eager: bool = option(False, "on CUDA: run decode steps eagerly instead of replaying CUDA graphs")
    tensor_parallel_size: int = option(
        1, "ranks that each hold a slice of every layer (gloo on the CPU); >1 starts the workers, or runs under torchrun"
    )

    @property
    def swap_space_bytes(self) -> int:
        """swap_space in bytes: a plain number counts GiB, as vLLM's swap_space does (0: every preemption
        recomputes)."""
        value = self.swap_space
        if isinstance(value, str) and _NUMBER.match(value):
            value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value) or value < 0:
                raise InvalidInputError(f"swap_space must be a number of GiB >= 0 or a size, got {self.swap_space!r}")
            return int(value * 2**30)
        return _memory_size("swap_space", value)

    def __post_init__(self) -> None:
        _require_choice("dtype", self.dtype, DTYPES)
        _require_positive("block_size", self.block_size)
        _require_positive("max_num_seqs", self.max_num_seqs)
        _require_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _require_positive("max_n", self.max_n)
        _require_positive("tensor_parallel_size", self.tensor_parallel_size)
        if self.num_blocks is not None:
            _require_positive("num_blocks", self.num_blocks)
        if self.max_model_len is not None:
            _require_positive("max_model_len", self.max_model_len)
        if _memory_size("kv_cache_memory", self.kv_cache_memory) <= 0:
            raise InvalidInputError("kv_cache_memory must be positive")
        self.swap_space_bytes  # a bad value is refused here, not at the first preemption
        _require_choice("allocator", self.allocator, ALLOCATORS)
        _require_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _require_choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        if self.reasoning_parser is not None:
            _require_choice("reasoning_parser", self.reasoning_parser, REASONING_PARSERS)
        reasoning_strings(self.reasoning_config)  # a bad config is refused here, not at the first request
        _require_device_name(self.device)
        _require_fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        if not is_int(self.seed) or not -(2**63) <= self.seed < 2**64:
            raise InvalidInputError(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if isinstance(self.model, os.PathLike):
            self.model = os.fspath(self.model)
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise InvalidInputError(f"model must be a path (HF directory or .gguf file), got {self.model!r}")
        _require_bool("enable_prefix_caching", self.enable_prefix_caching)
        _require_bool("enforce_eager", self.enforce_eager)
        name = self.served_model_name
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InvalidInputError(f"served_model_name must be a non-empty string, got {name!r}")


def reasoning_strings(reasoning_config: str | dict | None) -> dict[str, str]:
    """vLLM's `--reasoning-config` (JSON text or a dict) read and checked: {"reasoning_start_str",
    "reasoning_end_str"}, each optional, each a non-empty string."""
    if reasoning_config is None:
        return {}
    config = reasoning_config
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"reasoning_config must be a JSON object: {exc}") from None
    if not isinstance(config, dict):
        raise InvalidInputError(f"reasoning_config must be a JSON object, got {reasoning_config!r:.80}")
    if unknown := sorted(set(config) - set(REASONING_CONFIG_KEYS)):
        raise InvalidInputError(f"reasoning_config takes {', '.join(REASONING_CONFIG_KEYS)}; not {unknown}")
    for key, value in config.items():
        if not isinstance(value, str) or not value:
            raise InvalidInputError(f"reasoning_config.{key} must be a non-empty string, got {value!r:.80}")
    return dict(config)


def _memory_size(name: str, value: str | int) -> int:
    try:
        return parse_memory_size(value)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{name}: {exc}") from None


def _require_positive(name: str, value: int) -> None:
    if not is_int(value) or value <= 0:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")


def _require_bool(name: str, value: bool) -> None:
    if not isinstance(value, bool):
        raise InvalidInputError(f"{name} must be True or False, got {value!r}")


def _require_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidInputError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _require_device_name(value: str) -> None:
    """The name's form only; whether the device exists is checked when the engine resolves it."""
    if not isinstance(value, str) or not _DEVICE.match(value):
        raise InvalidInputError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}")


def _require_fraction(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise InvalidInputError(f"{name} must be a number in (0, 1], got {value!r}")
