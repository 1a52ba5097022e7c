"""Where the engine runs, and the one place tensors cross between the host and that device.

Every host -> device copy of a step goes through to_device and every device -> host copy through to_host,
so a test can list them with record_transfers() even when the "device" is the CPU (no copy is made
then, but the call is still recorded: the test checks which transfers the code asks for).
"""

import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch

from pagedllm.errors import InvalidInputError

_CUDA_NAME = re.compile(r"^cuda(?::(\d+))?$")


def resolve_device(name: str) -> torch.device:
    """"auto" -> CUDA when torch sees a GPU, else the CPU; "cpu", "cuda", "cuda:N" -> that device, if present."""
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    match = _CUDA_NAME.match(name) if isinstance(name, str) else None
    if match is None:
        raise InvalidInputError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(match.group(1) or 0)
    if index >= count:
        seen = f"{count} CUDA device(s)" if count else "no CUDA device (CPU-only torch build or no GPU)"
        raise InvalidInputError(f"device {name!r} asked for, but torch sees {seen}")
    return torch.device("cuda", index)


def current(device: torch.device) -> AbstractContextManager:
    """Make `device` the current CUDA device for a block (a no-op on the CPU).

    Triton launches its kernels on the current device, which is per thread and cuda:0 unless set: the
    engine's calls that launch kernels run inside this, so cuda:N works from any thread (the server's too).
    """
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


@dataclass(frozen=True, slots=True)
class Transfer:
    direction: str  # "h2d" or "d2h"
    what: str  # what the tensor holds, e.g. "step inputs"
    nbytes: int


_recorders: list[list[Transfer]] = []


@contextmanager
def record_transfers() -> Iterator[list[Transfer]]:
    """Collect every to_device / to_host call made inside the block (for tests)."""
    log: list[Transfer] = []
    _recorders.append(log)
    try:
        yield log
    finally:
        _recorders.remove(log)


def _record(direction: str, what: str, tensor: torch.Tensor) -> None:
    _record_bytes(direction, what, tensor.numel() * tensor.element_size())


def _record_bytes(direction: str, what: str, nbytes: int) -> None:
    for log in _recorders:
        log.append(Transfer(direction, what, nbytes))


def to_device(host: torch.Tensor, device: torch.device, what: str) -> torch.Tensor:
    """Copy a host tensor to the device without waiting: from pinned memory (pinned here if it is not yet),
    so the copy is a DMA ordered on the device's stream. The same tensor when the device is the CPU."""
    _record("h2d", what, host)
    if device.type == "cpu":
        return host
    if not host.is_pinned():
        host = host.pin_memory()  # torch's pinned allocator keeps the buffer until the copy has finished
    return host.to(device, non_blocking=True)


def to_device_packed(parts: list[torch.Tensor], device: torch.device, what: str) -> list[torch.Tensor]:
    """Several 1-D host tensors of one dtype to the device in one copy (to_device), as views that each
    start 16 bytes aligned (on the CPU, where nothing is copied, the tensors themselves when they are).
    Triton compiles a kernel once per alignment of its pointer arguments, so views at arbitrary offsets would
    make new combinations, and new compiles, in the middle of a run."""
    per_line = max(1, 16 // parts[0].element_size())
    padded = [-(-p.numel() // per_line) * per_line for p in parts]
    if device.type == "cpu" and all(p.is_contiguous() and p.data_ptr() % 16 == 0 for p in parts):
        # nothing to copy: the parts as they are (packing them took 0.1 ms of a 19 ms decode step), recorded
        # as the one copy a device would take
        _record_bytes("h2d", what, sum(padded) * parts[0].element_size())
        return list(parts)
    flat = torch.zeros(sum(padded), dtype=parts[0].dtype)
    for piece, part in zip(flat.split(padded), parts):
        piece[: part.numel()] = part
    sent = to_device(flat, device, what)
    return [piece[: part.numel()] for piece, part in zip(sent.split(padded), parts)]


def to_host(tensor: torch.Tensor, what: str, pinned: bool = False) -> torch.Tensor:
    """Copy a device tensor to the host; the same tensor when it is on the CPU.

    pinned=False waits for the copy (the caller reads the values). pinned=True copies into pinned memory
    without waiting: for data the host only keeps and later sends back (swap), so stream order suffices.
    """
    _record("d2h", what, tensor)
    if tensor.device.type == "cpu":
        return tensor
    if not pinned:
        return tensor.cpu()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)
