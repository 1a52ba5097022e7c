"""The scheduler on its own, against a fake KV manager: exact admission, chunking, preemption and fork
orders, step by step. Tokens are made up; the model never runs."""

import pytest
from fake_kv import FakeKV, FakeSwap

from pagedllm.config import EngineConfig
from pagedllm.engine.completion import Completion
from pagedllm.engine.outcome import SampledToken, StepOutcome
from pagedllm.engine.request import Request
from pagedllm.engine.scheduler import Scheduler
from pagedllm.engine.step import SchedulerOutput
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

TOKEN = 7  # every sampled token


def make(num_blocks: int, block_size: int = 4, budget: int = 64, max_num_seqs: int = 64, mode: str = "recompute",
         max_model_len: int = 256, swap_tokens: int | None = None) -> Scheduler:
    config = EngineConfig(block_size=block_size, num_blocks=num_blocks, max_num_batched_tokens=budget,
                          max_num_seqs=max_num_seqs, preemption_mode=mode)
    return Scheduler(config, FakeKV(num_blocks, block_size), max_model_len, FakeSwap(), swap_tokens)


def add(sched: Scheduler, name: str, prompt_len: int, max_tokens: int = 50, n: int = 1) -> Request:
    params = SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0 if n > 1 else 0.0)
    prompt = list(range(10, 10 + prompt_len))
    request = Request(name, None, prompt, params, prompt_len + max_tokens)  # small pools: no fit check
    request.metrics.arrival_time = float(len(sched.waiting) + len(sched.running))  # distinct, in add order
    sched.add(request, Completion(0, None, None))
    return request


def step(sched: Scheduler, finish: tuple[str, ...] = ()) -> list[tuple[str, int, int]]:
    """Schedule, sample, update. Returns (request id, completion index, tokens) in schedule order."""
    out = sched.schedule()
    scheduled = [(s.request.request_id, s.seq.index, s.num_new_tokens) for s in out.scheduled]
    sched.update(out, sampled(out, finish))
    return scheduled


def sampled(out: SchedulerOutput, finish: tuple[str, ...] = ()) -> StepOutcome:
    """TOKEN for every sequence that needs one; a fresh n > 1 request forks; requests in `finish` end."""
    outcome = StepOutcome()
    for s in out.logits_seqs():
        request, reason = s.request, "length" if s.request.request_id in finish else None
        if request not in outcome.sampled:
            outcome.sampled.append(request)
        outcome.tokens.append(SampledToken(request, s.seq, s.seq.completion, TOKEN, 0.0, None, False, reason))
        if request.is_fresh and request.params.n > 1:
            outcome.tokens += [SampledToken(request, s.seq, Completion(i, None, None), TOKEN, 0.0, None, True, reason)
                               for i in range(1, request.params.n)]
    return outcome


def names(requests) -> list[str]:
    return [r.request_id for r in requests]


def test_budget_exhausted_mid_prompt_chunks_the_next_prompt():
    sched = make(num_blocks=64, budget=8)
    add(sched, "a", 6)
    add(sched, "b", 10)
    assert step(sched) == [("a", 0, 6), ("b", 0, 2)]  # b gets what is left of the budget
    assert step(sched) == [("a", 0, 1), ("b", 0, 7)]  # a's decode first, then b's next chunk
    assert step(sched) == [("a", 0, 1), ("b", 0, 1)]  # b's last prompt token: it samples now
    assert step(sched) == [("a", 0, 1), ("b", 0, 1)]
    assert [r.seqs[0].num_computed for r in sched.running] == [9, 11]


def test_a_decode_that_needs_a_block_preempts_the_latest_arrival():
    sched = make(num_blocks=4, budget=64)
    for name in "abcd":
        add(sched, name, 4)  # one full block each: the pool is full after the prefill
    assert step(sched) == [("a", 0, 4), ("b", 0, 4), ("c", 0, 4), ("d", 0, 4)]
    out = sched.schedule()  # every decode needs a fresh block, none is free
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 1)]
    assert names(out.preempted) == ["d", "c"]  # latest arrival first, never the oldest
    assert names(sched.waiting) == ["c", "d"]  # back at the front, in arrival order
    assert [r.seqs[0].num_computed for r in sched.waiting] == [0, 0]  # recompute: their K/V are gone
    assert sched.kv.num_used_blocks == 4 and sched.num_preemptions == 2


def test_a_step_that_preempts_admits_no_waiting_request():
    sched = make(num_blocks=4, budget=9)
    add(sched, "a", 4)
    add(sched, "v", 40)
    assert step(sched) == [("a", 0, 4), ("v", 0, 5)]  # v's first chunk takes two blocks
    out = sched.schedule()
    # a's decode takes the last block; v's next chunk does not fit, so v (the latest) preempts itself,
    # freeing two blocks. A chunk of v would fit in them now, but not in the step that preempted.
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1)]
    assert names(out.preempted) == ["v"] and names(sched.waiting) == ["v"] and names(sched.running) == ["a"]
    assert sched.kv.num_used_blocks == 2
    sched.update(out, sampled(out))
    assert step(sched) == [("a", 0, 1), ("v", 0, 8)]  # the next step readmits it: budget 9 - 1 = 8 -> 2 blocks


def test_swap_saves_the_victims_kv_and_restores_it_before_its_next_token():
    sched = make(num_blocks=4, budget=64, mode="swap")
    a, b = add(sched, "a", 4), add(sched, "b", 7)
    assert step(sched) == [("a", 0, 4), ("b", 0, 7)]  # a: block 0; b: blocks 1, 2
    assert step(sched) == [("a", 0, 1), ("b", 0, 1)]  # a takes block 3; b's 8th token fills block 2
    b_id = b.seqs[0].seq_id
    out = sched.schedule()  # b's 9th token needs a block, none is free: b (the latest) is swapped out
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1)]
    assert names(out.preempted) == ["b"] and sched.swap.saved == {b_id: ([1, 2], 8)}
    assert b.seqs[0].num_computed == 8 and not sched.kv.has_seq(b_id)  # K/V kept aside, blocks given back
    sched.update(out, sampled(out))
    # b's K/V would fit in a's step, but not with its 9th token beside a's next: restored there, it would be
    # swapped out again at once. It waits for a to end.
    assert step(sched, finish=("a",)) == [("a", 0, 1)]
    assert sched.swap.restored == [] and a.finished
    assert step(sched) == []  # b comes back in this step, restored at once
    assert sched.swap.restored == [(b_id, [2, 1])] and len(sched.swap) == 0 and names(sched.running) == ["b"]
    assert step(sched) == [("b", 0, 1)]  # its pending token, against the restored K/V
    assert b.seqs[0].num_computed == 9



@pytest.mark.parametrize("room,swapped", [(8, True), (7, False)])
def test_a_victim_past_the_swap_spaces_room_is_recomputed(room, swapped):
    sched = make(num_blocks=4, budget=64, mode="swap", swap_tokens=room)
    a, b = add(sched, "a", 4), add(sched, "b", 7)
    step(sched), step(sched)
    out = sched.schedule()  # b, 8 tokens computed, is preempted (as in the test above)
    assert names(out.preempted) == ["b"] and (b.seqs[0].seq_id in sched.swap) == swapped
    assert b.seqs[0].num_computed == (8 if swapped else 0) and sched.swap.tokens_held == (8 if swapped else 0)


def test_recompute_readmits_prompt_and_output_so_far():
    sched = make(num_blocks=3, budget=64)
    add(sched, "a", 4)
    b = add(sched, "b", 7)
    step(sched)
    step(sched)  # a: 5 tokens in 2 blocks; b: 8 in 2 blocks -> 1 too many: b waits
    assert names(sched.waiting) == ["b"] and b.seqs[0].num_computed == 0
    step(sched, finish=("a",))
    assert step(sched) == [("b", 0, 8)]  # prompt 7 + the token it sampled, computed again in one go


def test_parallel_sampling_forks_after_the_prompt_and_decodes_each_sequence():
    sched = make(num_blocks=16)
    request = add(sched, "p", 6, n=3)
    assert step(sched) == [("p", 0, 6)]  # the prompt once
    seqs = request.seqs
    assert [s.index for s in seqs] == [0, 1, 2] and len({s.seq_id for s in seqs}) == 3
    assert all(isinstance(s.seq_id, int) for s in seqs)
    assert sched.kv.forks == [(seqs[0].seq_id, seqs[1].seq_id), (seqs[0].seq_id, seqs[2].seq_id)]
    assert [s.token_ids for s in seqs] == [request.prompt_token_ids + [TOKEN]] * 3
    assert [s.num_computed for s in seqs] == [6, 6, 6]
    assert [sched.request_of(s.seq_id) for s in seqs] == [request] * 3
    out = sched.schedule()
    assert [(s.seq.index, s.num_new_tokens, s.num_cached) for s in out.scheduled] == [(0, 1, 6), (1, 1, 6), (2, 1, 6)]
    # block 1 (positions 4..5 of the prompt) was shared by all three: the first two writers copy it
    assert out.copies == [(1, 2), (1, 3)]  # the last sharer writes in place


def test_a_request_whose_second_sequence_does_not_fit_holds_no_block():
    sched = make(num_blocks=5, budget=64)
    add(sched, "a", 4)
    p = add(sched, "p", 3, n=2)
    step(sched)  # a: block 0; p: prompt in block 1, then forked into 2 sequences
    step(sched)  # a: block 2; p: the first writer copies the shared tail into block 3
    assert sched.kv.num_used_blocks == 4 and len(p.live_seqs) == 2
    out = sched.schedule()  # p's second sequence needs a block, none is free: p (the latest) is preempted
    assert names(out.preempted) == ["p"] and sched.kv.num_used_blocks == 2
    sched.update(out, sampled(out))
    # Readmitting p takes 2 blocks per sequence (5 tokens each); 3 are free: the first fits, the second not.
    assert step(sched) == [("a", 0, 1)]
    assert names(sched.waiting) == ["p"]
    assert all(not sched.kv.has_seq(s.seq_id) for s in p.seqs), "a half-admitted request kept its blocks"
    assert sched.kv.num_used_blocks == 2


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_max_num_seqs_is_exact(limit):
    sched = make(num_blocks=64, max_num_seqs=limit)
    requests = [add(sched, f"r{i}", 4, max_tokens=3) for i in range(5)]
    history = []
    while sched.has_work():
        history.append(step(sched, finish=tuple(r.request_id for r in requests if len(r.seqs[0].output_ids) == 2)))
        assert len(sched.running) <= limit
    assert max(len(h) for h in history) == limit
    assert all(r.finished for r in requests) and sched.concurrency.peak == limit
    if limit == 1:  # one at a time, in arrival order: prefill, two decodes, then the next
        assert [h[0][0] for h in history] == [f"r{i}" for i in range(5) for _ in range(3)]


def test_a_fresh_n_gt_1_request_counts_its_full_width_against_max_num_seqs():
    sched = make(num_blocks=64, max_num_seqs=3)
    add(sched, "a", 4)
    add(sched, "p", 4, n=3)
    assert step(sched) == [("a", 0, 4)]  # p will fork to 3 sequences: 1 + 3 > 3
    with pytest.raises(InvalidInputError, match="max_num_seqs"):
        sched.check_request(4, 4, None)  # could never run


def test_a_prompt_of_exactly_max_model_len_tokens_is_rejected():
    sched = make(num_blocks=64, max_model_len=32)
    with pytest.raises(InvalidInputError, match="maximum context length is 32"):
        sched.check_request(32, 1, None)
    assert sched.check_request(31, 1, None) == 32  # one output token fits
    assert sched.check_request(20, 1, 5) == 25


def test_abort_frees_blocks_and_swapped_kv():
    sched = make(num_blocks=4, budget=64, mode="swap")
    add(sched, "a", 4)
    b = add(sched, "b", 7)
    step(sched)
    step(sched)
    out = sched.schedule()  # b swapped out
    sched.update(out, sampled(out))
    assert b.seqs[0].seq_id in sched.swap
    sched.abort(b)
    assert len(sched.swap) == 0 and b.finished and b.seqs[0].finish_reason == "abort"
    assert names(sched.waiting) == [] and len(sched.seqs) == 1  # only a's sequence keeps its id
