"""The memory policies a simulation compares: contiguous reservations and paged blocks (with or without prefix sharing)."""

from collections.abc import Sequence

from pagedllm.errors import InvalidInputError
from pagedllm.kv.contiguous import ContiguousAllocator
from pagedllm.kv.manager import KVCacheManager
from pagedllm.sim.accounting import MemoryReport, contiguous_report, paged_report
from pagedllm.sim.config import SimConfig
from pagedllm.sim.memory_map import MapEntry, MemoryMap
from pagedllm.sim.requests import SimRequest


class ContiguousPolicy:
    def __init__(self, name: str, cfg: SimConfig, kind: str) -> None:
        self.name = name
        self.alloc = ContiguousAllocator(cfg.pool_slots, cfg.max_len, kind)  # type: ignore[arg-type]

    def admit(self, req: SimRequest) -> bool:
        res = self.alloc.allocate(req.seq_id, req.prompt_len + req.generated, req.max_tokens, req.final_len)
        return res is not None

    def grow(self, req: SimRequest) -> bool:
        return self.alloc.append(req.seq_id)

    def release(self, req: SimRequest) -> None:
        self.alloc.free(req.seq_id)

    def end_step(self) -> None:
        pass

    def report(self, head: SimRequest | None) -> MemoryReport:
        need = None if head is None else self.alloc.reservation_size(head.prompt_len, head.max_tokens)
        return contiguous_report(self.alloc, need)

    def check_invariants(self) -> None:
        self.alloc.check_invariants()

    def memory_map(self, step: int, head: SimRequest | None) -> MemoryMap:
        entries = [MapEntry(r.seq_id, r.used, r.final_len, r.reserved, start=r.start)
                   for r in self.alloc.reservations()]
        need = None if head is None else self.alloc.reservation_size(head.prompt_len, head.max_tokens)
        return MemoryMap(self.name, step, self.alloc.num_slots, None, entries, report=self.report(head),
                         free_runs=self.alloc.free_runs(), next_need=need)


class PagedPolicy:
    def __init__(self, name: str, cfg: SimConfig, block_size: int, prefix: bool) -> None:
        self.name = name
        self.block_size = block_size
        self.prefix = prefix
        self.manager = KVCacheManager(cfg.pool_slots // block_size, block_size, enable_prefix_caching=prefix)
        self._final: dict[str, int] = {}
        self._tokens: dict[str, list[int]] = {}  # real token ids, kept only when prefixes are shared

    def _token_ids(self, req: SimRequest, n: int) -> Sequence[int]:
        # Without prefix caching the manager only checks the length, so a range stands in for the tokens.
        return [req.token_id(p) for p in range(n)] if self.prefix else range(n)

    def admit(self, req: SimRequest) -> bool:
        n = req.prompt_len + req.generated
        tokens = self._token_ids(req, n)
        hit = self.manager.lookup_prefix(tokens)
        if self.manager.allocate(req.seq_id, tokens, n - hit.num_tokens, prefix=hit) is None:
            return False
        self._final[req.seq_id] = req.final_len
        if self.prefix:
            self._tokens[req.seq_id] = tokens  # type: ignore[assignment]
        return True

    def grow(self, req: SimRequest) -> bool:
        n = req.num_tokens + 1
        if not self.prefix:
            return self.manager.allocate(req.seq_id, range(n), 1) is not None
        tokens = self._tokens[req.seq_id]
        tokens.append(req.token_id(req.num_tokens))
        if self.manager.allocate(req.seq_id, tokens, 1) is None:
            tokens.pop()
            return False
        return True

    def release(self, req: SimRequest) -> None:
        self.manager.free(req.seq_id)
        del self._final[req.seq_id]
        self._tokens.pop(req.seq_id, None)

    def end_step(self) -> None:
        self.manager.step_ran()  # the simulated step "wrote" every block hashed for it

    def report(self, head: SimRequest | None) -> MemoryReport:
        return paged_report(self.manager, self.block_size, self._final)

    def check_invariants(self) -> None:
        self.manager.check_invariants()
        # accounting assumes only private tail blocks are partly filled; the manager counts slot by slot
        counted, stored = self.report(None).tokens, self.manager.stats().tokens_stored
        assert counted == stored, f"{self.name}: accounting sees {counted} tokens, the manager {stored}"

    def memory_map(self, step: int, head: SimRequest | None) -> MemoryMap:
        m = self.manager
        entries = [MapEntry(sid, m.num_tokens(sid), final, len(m.block_table(sid)) * self.block_size,
                            blocks=m.block_table(sid)) for sid, final in self._final.items()]
        cached = [b.block_id for b in m.snapshot() if b.state == "cached"] if self.prefix else []
        return MemoryMap(self.name, step, m.num_blocks * self.block_size, self.block_size, entries,
                         report=self.report(head), cached_blocks=cached)


Policy = ContiguousPolicy | PagedPolicy


def make_policy(name: str, cfg: SimConfig) -> Policy:
    if name not in cfg.policy_names():
        raise InvalidInputError(f"unknown policy {name!r}; choose one of {', '.join(cfg.policy_names())}")
    kind, _, arg = name.partition("-")
    if kind == "contig":
        return ContiguousPolicy(name, cfg, "max_len" if arg == "max" else arg)
    return PagedPolicy(name, cfg, int(arg), prefix=kind == "prefix")

