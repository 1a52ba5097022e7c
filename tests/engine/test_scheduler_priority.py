"""scheduling_policy="priority": the scheduler's two queues by (priority, arrival), its victim the lowest-ranked
running request, step by step against the fake KV manager (as test_scheduler.py); and the engine's and LLM's
priority argument, on the tiny model."""

import pytest
from fake_kv import FakeKV, FakeSwap
from test_scheduler import names, step

from pagedllm.config import EngineConfig
from pagedllm.engine.completion import Completion
from pagedllm.engine.request import Request
from pagedllm.engine.scheduler import Scheduler
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams


def make(num_blocks: int, max_num_seqs: int = 64, policy: str = "priority") -> Scheduler:
    config = EngineConfig(block_size=4, num_blocks=num_blocks, max_num_batched_tokens=64, max_num_seqs=max_num_seqs,
                          scheduling_policy=policy)
    return Scheduler(config, FakeKV(num_blocks, 4), 256, FakeSwap())


def add(sched: Scheduler, name: str, prompt_len: int, priority: int) -> Request:
    prompt = list(range(10, 10 + prompt_len))
    request = Request(name, None, prompt, SamplingParams(max_tokens=50, temperature=0.0), prompt_len + 50)
    request.priority = priority
    request.metrics.arrival_time = float(len(sched.waiting) + len(sched.running))  # distinct, in add order
    sched.add(request, Completion(0, None, None))
    return request


def test_waiting_requests_are_admitted_by_priority_then_arrival():
    sched = make(num_blocks=64, max_num_seqs=1)
    for name, priority in (("a", 0), ("b", -1), ("c", 3), ("d", -1)):
        add(sched, name, 4, priority)
    assert names(sched.waiting) == ["b", "d", "a", "c"]
    assert step(sched) == [("b", 0, 4)]  # one sequence at a time: the highest priority first
    step(sched, finish=("b",))
    assert step(sched) == [("d", 0, 4)]  # the same priority: the earlier arrival


def test_fcfs_keeps_arrival_order_whatever_the_priority_field_holds():
    sched = make(num_blocks=64, max_num_seqs=1, policy="fcfs")
    for name, priority in (("a", 5), ("b", -5)):
        add(sched, name, 4, priority)
    assert names(sched.waiting) == ["a", "b"]


def test_running_requests_grow_in_rank_order_and_the_lowest_rank_is_preempted():
    sched = make(num_blocks=4)
    for name, priority in (("a", 5), ("b", 0), ("c", 0), ("d", 1)):
        add(sched, name, 4, priority)  # one full block each: the pool is full after the prefill
    assert step(sched) == [("b", 0, 4), ("c", 0, 4), ("d", 0, 4), ("a", 0, 4)]
    out = sched.schedule()  # every decode needs a fresh block, none is free
    assert names(out.preempted) == ["a", "d"]  # the oldest goes first: its priority is the lowest
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("b", 1), ("c", 1)]
    assert names(sched.waiting) == ["d", "a"]  # back in the queue by rank, not simply at its front


def test_a_preempted_request_waits_behind_higher_priorities_that_arrived_later():
    sched = make(num_blocks=2)
    add(sched, "a", 4, 2)
    add(sched, "b", 4, 0)
    step(sched)  # both prefilled, the pool is full
    add(sched, "c", 4, 1)  # waits: no block is free
    out = sched.schedule()
    assert names(out.preempted) == ["a"]
    assert names(sched.waiting) == ["c", "a"]


def test_the_engine_takes_a_priority_only_under_the_priority_policy(tiny_llama_dir):
    from pagedllm.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4))
    params = SamplingParams(max_tokens=2, temperature=0.0)
    engine.add_request("zero", [5, 6, 7], params, priority=0)
    with pytest.raises(InvalidInputError, match="scheduling_policy 'priority'"):
        engine.add_request("high", [5, 6, 7], params, priority=-1)
    for bad in (1.5, True, "1"):
        with pytest.raises(InvalidInputError, match="priority must be an integer"):
            engine.add_request("bad", [5, 6, 7], params, priority=bad)
    assert list(engine.requests) == ["zero"]  # nothing refused was queued


def test_llm_generate_finishes_by_priority_with_one_sequence_at_a_time(tiny_llama_dir):
    from pagedllm import LLM

    llm = LLM(model=str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4, max_num_seqs=1,
              scheduling_policy="priority")
    prompts = [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False, priority=[2, 0, 1])
    assert [o.prompt_token_ids for o in outputs] == prompts  # in prompt order, as always
    finish = [o.metrics.finished_time for o in outputs]
    assert finish[1] < finish[2] < finish[0]
    alone = llm.generate(prompts, params, use_tqdm=False)  # the same tokens whatever the order
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in alone]
    one_for_all = llm.generate(prompts[:2], params, use_tqdm=False, priority=4)
    assert len(one_for_all) == 2
    for bad in ([0], [0, 1, 2, 3], "high"):
        with pytest.raises(InvalidInputError, match="priority must be an int or a list"):
            llm.generate(prompts, params, use_tqdm=False, priority=bad)
    with pytest.raises(InvalidInputError, match="priority must be an integer"):
        llm.generate(prompts, params, use_tqdm=False, priority=[0, 1, None])
    assert not llm.engine.has_unfinished_requests()  # a refused batch leaves nothing queued
