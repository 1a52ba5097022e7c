"""The ranks of one tensor-parallel engine: the torch.distributed process group and the collectives the
engine uses on it (the per-step message, the per-layer all-reduce, the logits reduction)."""

import datetime
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pagedllm.engine.sampler import SampleResult
from pagedllm.engine.step_logits import StepLogits
from pagedllm.errors import InvalidInputError
from pagedllm.model.parallel import ParallelLayout

# Words of the first broadcast of a step; a longer message sends its rest in a second broadcast.
MESSAGE_HEAD_WORDS = 4096
TIMEOUT_ENV = "PAGEDLLM_TP_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
STARTUP_TIMEOUT_S = 1800.0  # loading the shards; a step's collectives use the shorter timeout


def step_timeout_s() -> float:
    """Seconds a rank waits on a collective before it declares the others dead or hung."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0.001):  # gloo counts whole milliseconds
        raise InvalidInputError(f"${TIMEOUT_ENV} must be a positive number of seconds (0.001 or more), got {text!r}")
    return value


@dataclass(slots=True)
class RankGroup:
    rank: int
    size: int
    control: dist.ProcessGroup | None  # gloo over host memory: the step message and barriers (None once left)
    data: dist.ProcessGroup | None  # the device's backend: the all-reduces and the logits (= control on the CPU)
    device: torch.device

    @classmethod
    def join(cls, rank: int, size: int, store: dist.Store | None = None) -> "RankGroup":
        """Join the default group (from `store`, else env:// as under torchrun) and make the control group;
        the data group follows once the device is known (use_device)."""
        startup = datetime.timedelta(seconds=STARTUP_TIMEOUT_S)
        if store is None:
            dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size, timeout=startup)
        else:
            dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=startup)
        control = _new_group(size, "gloo")
        return cls(rank, size, control, control, torch.device("cpu"))

    def use_device(self, device_type: str, local_rank: int) -> None:
        """Every rank calls this with the same device type: CUDA ranks get an NCCL data group."""
        if device_type == "cuda":
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
            self.data = _new_group(self.size, "nccl")

    def leave(self) -> None:
        """Destroy the process groups and drop this rank's handles on them, so that their gloo threads are
        joined now. A gloo thread that frees a collective's last tensor after the interpreter has begun to
        finalize cannot take the GIL and aborts the process ("terminate called without an active exception")."""
        leave_default_group()
        self.control = self.data = None

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.data)
        return x

    # -- the step message --------------------------------------------------------------------

    def send_words(self, words: list[int]) -> None:
        head = torch.zeros(MESSAGE_HEAD_WORDS, dtype=torch.int64)
        first = words[: MESSAGE_HEAD_WORDS - 1]
        head[0] = len(words)
        head[1 : 1 + len(first)] = torch.tensor(first, dtype=torch.int64)
        dist.broadcast(head, src=0, group=self.control)
        if len(words) > len(first):
            dist.broadcast(torch.tensor(words[len(first) :], dtype=torch.int64), src=0, group=self.control)

    def receive_words(self) -> list[int]:
        head = torch.empty(MESSAGE_HEAD_WORDS, dtype=torch.int64)
        dist.broadcast(head, src=0, group=self.control)
        total = int(head[0])
        words = head[1 : 1 + min(total, MESSAGE_HEAD_WORDS - 1)].tolist()
        if total > len(words):
            rest = torch.empty(total - len(words), dtype=torch.int64)
            dist.broadcast(rest, src=0, group=self.control)
            words += rest.tolist()
        return words

    # -- logits --------------------------------------------------------------------------------

    @torch.inference_mode()
    def reduce_logits(
        self, local: torch.Tensor, greedy_rows: list[bool], layout: ParallelLayout, vocab_size: int
    ) -> StepLogits | None:
        """local: this rank's [rows, vocab slice] logits. Greedy rows travel as (max, argmax, logsumexp) per
        rank, the others whole; rank 0 gets the step's StepLogits, the other ranks None."""
        local = local.float()
        local[:, layout.vocab_stop - layout.vocab_start :] = float("-inf")  # the last rank's padding columns
        greedy = [i for i, g in enumerate(greedy_rows) if g]
        full = [i for i, g in enumerate(greedy_rows) if not g]
        summaries = self._gather(_summarise(local[greedy], layout.vocab_start)) if greedy else None
        wholes = self._gather(local[full].contiguous()) if full else None
        if self.rank != 0:
            return None
        full_logits = torch.cat(wholes, dim=1)[:, :vocab_size] if wholes else local.new_empty(0, vocab_size)
        index = [-1] * len(greedy_rows)
        for position, row in enumerate(full):
            index[row] = position
        picks = _combine(summaries) if summaries else []
        return StepLogits(full_logits, index, dict(zip(greedy, picks)))

    def _gather(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(x, parts, dst=0, group=self.data)
        return parts


def _new_group(size: int, backend: str) -> dist.ProcessGroup:
    return dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=step_timeout_s()), backend=backend)


def _summarise(logits: torch.Tensor, vocab_start: int) -> torch.Tensor:
    """[rows, slice] -> [rows, 3] float64: the slice's max, its token id, and logsumexp over the slice."""
    arg = logits.argmax(dim=-1)  # the first maximum, as the sampler's argmax
    best = logits.gather(1, arg.unsqueeze(1)).squeeze(1)
    lse = logits.logsumexp(dim=-1)
    return torch.stack([best.double(), (arg + vocab_start).double(), lse.double()], dim=1)


def _combine(summaries: list[torch.Tensor]) -> list[SampleResult]:
    """Per row: the token of the rank with the greatest max (the lowest rank on a tie, as argmax over the
    whole row picks the lowest id), and its raw logprob against the logsumexp of every rank's slice."""
    stacked = torch.stack(summaries)  # [ranks, rows, 3]
    best_rank = stacked[:, :, 0].argmax(dim=0)  # first maximum on ties
    rows = torch.arange(stacked.shape[1], device=stacked.device)
    chosen = stacked[best_rank, rows]  # [rows, 3]
    log_z = stacked[:, :, 2].logsumexp(dim=0)
    tokens, logprobs = chosen[:, 1].long().tolist(), (chosen[:, 0] - log_z).tolist()
    return [SampleResult(t, lp, None) for t, lp in zip(tokens, logprobs)]


def leave_default_group() -> None:
    """Destroy this process's default group, if it has one (also after a join that failed halfway)."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a group whose peers are gone can fail to tear down; the process is ending anyway
            pass
