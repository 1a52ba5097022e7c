"""One trace request's life in one policy's run, and the synthetic token ids that give prefix groups shared text."""

from collections.abc import Sequence
from dataclasses import dataclass

from pagedllm.errors import InvalidInputError
from pagedllm.sim.trace import TraceRequest

_PRIVATE_TOKEN_BASE = 1 << 40  # token ids: group text < 2**40 <= private text, so they never collide


@dataclass(slots=True)
class SimRequest:
    """One request's life in one policy's run."""

    idx: int
    seq_id: str
    arrival: int
    prompt_len: int
    max_tokens: int
    final_len: int
    group: int | None  # index of its prefix group, if any
    prefix_len: int
    num_tokens: int = 0  # tokens with KV in the pool now (0 while waiting)
    generated: int = 0  # survives preemption: a recomputed request restarts at prompt + generated

    def token_id(self, pos: int) -> int:
        if self.group is not None and pos < self.prefix_len:
            return ((self.group + 1) << 20) + pos
        return _PRIVATE_TOKEN_BASE + (self.idx << 20) + pos


def prepare(trace: Sequence[TraceRequest], max_len: int) -> list[TraceRequest]:
    """Validate against max_len and sort by arrival (stable)."""
    for i, req in enumerate(trace):
        if req.prompt_len >= max_len:
            raise InvalidInputError(
                f"request {i} (arrival {req.arrival}): prompt_len {req.prompt_len} leaves no room "
                f"to generate within max-len {max_len}")
    return sorted(trace, key=lambda r: r.arrival)


def sim_requests(trace: Sequence[TraceRequest], max_len: int) -> list[SimRequest]:
    groups: dict[int | str, int] = {}
    out = []
    for i, t in enumerate(trace):
        max_tokens = t.max_tokens if t.max_tokens is not None else max_len - t.prompt_len
        final = min(t.prompt_len + min(t.output_len, max_tokens), max_len)
        group = None if t.prefix_group is None else groups.setdefault(t.prefix_group, len(groups))
        prefix_len = t.prompt_len if t.prefix_len is None else t.prefix_len
        out.append(SimRequest(i, f"r{i}", t.arrival, t.prompt_len, max_tokens, final, group, prefix_len))
    return out

