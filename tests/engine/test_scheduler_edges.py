"""Scheduler edges a mutation run showed unguarded: each test fails when the guarded line is changed
(the line is named in the test). The real KV manager where the pool's contents matter."""

import pytest
import torch
from fake_kv import FakeKV, FakeSwap
from test_scheduler import TOKEN, add, make, sampled, step

from pagedllm.config import EngineConfig
from pagedllm.engine.completion import Completion
from pagedllm.engine.outcome import StepOutcome
from pagedllm.engine.request import Request
from pagedllm.engine.reservation import ContiguousReservations
from pagedllm.engine.scheduler import Scheduler
from pagedllm.engine.swap import SwapSpace
from pagedllm.errors import InvalidInputError
from pagedllm.kv.manager import KVCacheManager
from pagedllm.sampling_params import SamplingParams


def real_scheduler(num_blocks: int, mode: str = "recompute", budget: int = 64) -> Scheduler:
    config = EngineConfig(block_size=4, num_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=8,
                          preemption_mode=mode)
    return Scheduler(config, KVCacheManager(num_blocks, 4), 256, FakeSwap())


def request(name: str, prompt_len: int, arrival: float, **params) -> Request:
    params = SamplingParams(max_tokens=20, **({"temperature": 0.0} | params))
    r = Request(name, None, list(range(10, 10 + prompt_len)), params, prompt_len + 20)
    r.metrics.arrival_time = arrival
    return r


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_block_filled_in_a_pass_that_preempts_its_request_is_not_left_findable(mode):
    """n=3 over 3 blocks: sequence 0's decode fills its copy-on-write block (hashed as it is allocated), then
    sequence 1 finds no block and the request preempts itself. That block's last slot was never written, so no
    later prompt may hit it (guards kv.free(seq, num_computed) in Scheduler._evict and its floor in the manager)."""
    sched = real_scheduler(3, mode)
    r = request("r", 7, 0.0, n=3, temperature=1.0)
    sched.add(r, Completion(0, None, None))
    out = sched.schedule()
    sched.update(out, sampled(out))  # the prompt, then the fork into 3 sequences
    tokens = list(r.seqs[0].token_ids)
    out = sched.schedule()
    assert out.preempted == [r]
    assert sched.kv.lookup_prefix(tokens + [99], ()).num_tokens <= 7  # what was computed
    sched.kv.check_invariants()


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_victim_scheduled_earlier_in_the_pass_leaves_the_step(mode):
    """Added first but arrived later (add_request(arrival_time=...)): scheduled first, then the latest arrival,
    so the victim of the next request's block (guards the filter of out.scheduled and out.cow in _preempt)."""
    sched = real_scheduler(2, mode)
    a, b = request("a", 3, arrival=5.0), request("b", 4, arrival=1.0)
    for r in (a, b):
        sched.add(r, Completion(0, None, None))
    out = sched.schedule()
    sched.update(out, sampled(out))
    out = sched.schedule()  # a's decode fits its block; b's needs one: a goes
    assert out.preempted == [a] and [(s.request, s.num_new_tokens) for s in out.scheduled] == [(b, 1)]
    assert not any(c[0] is a for c in out.cow)
    sched.update(out, sampled(out))
    sched.kv.check_invariants()


def test_a_contiguous_request_that_can_never_be_reserved_is_refused():
    """Two max-length runs of 16 slots in a pool of 16 (guards the per-sequence length in check_request)."""
    sched = Scheduler(EngineConfig(block_size=4, num_blocks=4, allocator="contiguous"), KVCacheManager(4, 4), 16,
                      FakeSwap())
    with pytest.raises(InvalidInputError):
        sched.check_request(3, 2, 2)
    assert sched.check_request(3, 1, 2) > 0


def test_a_failed_reservation_keeps_nothing_and_a_kept_one_is_not_doubled():
    """All or nothing (guards release() in reserve), and a readmission reserves nothing again (its early
    return)."""
    reservations = ContiguousReservations(num_slots=32, max_len=16)
    a, b = request("a", 3, 0.0), request("b", 3, 1.0, n=2, temperature=1.0)
    assert reservations.reserve(a) and reservations.num_reserved_slots == 16
    assert not reservations.reserve(b) and reservations.num_reserved_slots == 16
    assert not reservations.reserve(b)  # still no room: it did not keep a run from its failed try
    assert reservations.reserve(a) and reservations.num_reserved_slots == 16  # readmitted: the same run
    reservations.release(a)
    assert reservations.reserve(b) and reservations.num_reserved_slots == 32


def test_a_restored_sequence_leaves_the_swap_space():
    """Guards the pop in SwapSpace.restore: what was swapped in holds no host memory and no swap_space room."""
    import torch

    caches = [torch.arange(2 * 1 * 4 * 2 * 3, dtype=torch.float32).view(2, 1, 4, 2, 3)]
    swap = SwapSpace(caches)
    swap.save(7, [1, 2], 3)
    assert 7 in swap and swap.tokens_held == 3
    swap.restore(7, [0, 3])
    assert 7 not in swap and len(swap) == 0 and swap.tokens_held == 0


def test_waiting_beams_wait_when_the_step_budget_is_spent():
    """Guards `total <= budget or first` in _wanted_tokens: three beams behind a decoding request, budget 3."""
    sched = Scheduler(EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=3, max_num_seqs=8),
                      FakeKV(64, 4), 256, FakeSwap())
    a = request("a", 1, 0.0)
    b = request("b", 1, 1.0, n=3, use_beam_search=True)
    sched.add(a, Completion(0, None, None))
    sched.add(b, None)
    out = sched.schedule()
    sched.update(out, StepOutcome())
    for seq in (a.seqs[0], b.seqs[0]):
        seq.token_ids.append(TOKEN)  # each sampled a token (no model here)
    for index in (1, 2):
        sched._fork(b, b.seqs[0], index, None)  # the search widens to 3 beams
    assert sum(s.num_new_tokens for s in sched.schedule().scheduled) <= 3


def test_a_prompt_that_spends_the_budget_leaves_the_next_one_waiting():
    """Guards `budget > 0` in _schedule_waiting: a gets the whole budget of 8, b nothing this step."""
    sched = make(num_blocks=64, budget=8)
    add(sched, "a", 8)
    add(sched, "b", 5)
    assert step(sched) == [("a", 0, 8)]
    assert step(sched) == [("a", 0, 1), ("b", 0, 5)]


def test_a_width_of_exactly_max_n_is_accepted():
    sched = Scheduler(EngineConfig(block_size=4, num_blocks=64, max_n=4), FakeKV(64, 4), 256, FakeSwap())
    assert sched.check_request(3, 4, 5) > 0
    with pytest.raises(InvalidInputError, match="max_n"):
        sched.check_request(3, 5, 5)


def test_a_request_owed_prompt_logprobs_takes_only_the_cached_blocks_it_has_them_for():
    """The prompt's blocks are cached by another request; one that asked for prompt logprobs and has them for
    5 positions (a preempted one) takes 1 block of 4 from the cache, not 2 (guards the floor in
    _cacheable_prefix: position 5's logprob would be missing)."""
    from pagedllm.engine.outputs import TokenLogprob

    sched = real_scheduler(16)
    owner = request("a", 12, 0.0)
    sched.add(owner, Completion(0, None, None))
    out = sched.schedule()
    sched.update(out, sampled(out, finish=("a",)))
    owed = request("b", 12, 1.0, prompt_logprobs=1)
    owed.prompt_logprobs = [None] + [TokenLogprob(t, -1.0, {}) for t in owed.prompt_token_ids[1:6]]
    sched.add(owed, Completion(0, None, None))
    (scheduled,) = sched.schedule().scheduled
    assert scheduled.num_cached == 4 and scheduled.num_new_tokens == 8


def test_swap_space_counts_the_tokens_of_every_saved_sequence():
    caches = [torch.zeros(2, 1, 4, 2, 3), torch.ones(2, 1, 4, 2, 3)]
    swap = SwapSpace(caches)
    swap.save(7, [1, 2], 3)
    swap.save(8, [3], 2)
    assert (7 in swap, 8 in swap, 9 in swap, len(swap), swap.tokens_held) == (True, True, False, 2, 5)
    swap.drop(7)
    assert swap.tokens_held == 2
    swap.restore(8, [0])
    assert swap.tokens_held == 0 and len(swap) == 0
