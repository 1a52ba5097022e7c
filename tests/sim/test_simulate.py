import pytest

from pagedllm.errors import InvalidInputError
from pagedllm.sim.policies import make_policy
from pagedllm.sim.requests import prepare, sim_requests
from pagedllm.sim.simulate import Replay, SimConfig, simulate
from pagedllm.sim.trace import SyntheticConfig, TraceRequest, synthetic_trace


def test_default_chat_trace_paged_wastes_little_and_holds_far_more_requests():
    """The headline, on the real simulator, default pool and arrival rate, a shorter seeded trace."""
    trace = synthetic_trace(SyntheticConfig(num_requests=300, seed=0))
    result = simulate(trace, SimConfig(), ["contig-max", "paged-16"])
    contig, paged = result.policies["contig-max"], result.policies["paged-16"]
    assert contig.peak_waiting > 50 and paged.peak_waiting > 50  # the pool is the bottleneck
    assert sum(paged.peak_pct(k) for k in ("reservation", "internal", "external")) < 4.0
    assert sum(contig.peak_pct(k) for k in ("reservation", "internal", "external")) > 60.0
    assert paged.peak_running >= 2.5 * contig.peak_running
    assert paged.mean_running >= 2.5 * contig.mean_running
    assert contig.finished == paged.finished == 300
    assert contig.preemptions == 0


def test_every_policy_keeps_invariants_and_frees_everything():
    trace = synthetic_trace(SyntheticConfig(num_requests=30, seed=5, max_len=128, shared_fraction=0.5,
                                            prompt_mean=40, output_mean=40, system_prompt_len=32))
    cfg = SimConfig(pool_slots=512, max_len=128, block_sizes=(1, 4, 16, 64, 128), prefix_block_size=16)
    result = simulate(trace, cfg, check=True)  # report.check() and check_invariants() every step
    assert set(result.policies) == set(cfg.policy_names())
    assert result.policies["paged-1"].preemptions > 0 and result.policies["prefix-16"].preemptions > 0
    for r in result.policies.values():
        assert r.finished == 30
        assert r.utilization[-1] == 0.0  # the last recorded step: everything finished and freed


def test_growth_failure_preempts_the_latest_arrival_and_it_still_finishes():
    # 4 requests of 8-token prompts all admitted into 48 slots, each growing to 16: they cannot all fit
    trace = [TraceRequest(arrival=i, prompt_len=8, output_len=8) for i in range(4)]
    cfg = SimConfig(pool_slots=48, max_len=16, block_sizes=(4,), prefix_block_size=None)
    result = simulate(trace, cfg, check=True)
    paged = result.policies["paged-4"]
    # 12 blocks: at step 5 r0 needs its 4th block with all 12 held; r3 (the latest, 3 blocks) goes, and it
    # needs 3 blocks back for its 9 tokens, which are free only once r0 finishes at step 8
    assert paged.preemptions == 1 and paged.finished == 4
    assert result.policies["contig-max"].preemptions == 0
    assert result.policies["contig-max"].peak_running == 3  # 48 // 16


def test_exact_policy_beats_max_len_when_max_tokens_is_tight():
    trace = [TraceRequest(arrival=0, prompt_len=10, output_len=20, max_tokens=22) for _ in range(8)]
    cfg = SimConfig(pool_slots=256, max_len=128, block_sizes=(), prefix_block_size=None)
    result = simulate(trace, cfg, check=True)
    assert result.policies["contig-max"].peak_running == 2
    assert result.policies["contig-exact"].peak_running == 8
    assert result.policies["contig-exact"].peak_pct("internal") > 0  # reserved 32, ends at 30


def test_max_tokens_stops_generation():
    trace = [TraceRequest(arrival=0, prompt_len=10, output_len=100, max_tokens=5)]
    cfg = SimConfig(pool_slots=256, max_len=128, block_sizes=(4,), prefix_block_size=None)
    result = simulate(trace, cfg, ["paged-4"])
    assert result.policies["paged-4"].steps == 6  # admitted at step 0, 5 tokens in steps 1..5


def test_prefix_sharing_stores_a_common_system_prompt_once():
    trace = [TraceRequest(arrival=0, prompt_len=200, output_len=10, prefix_group="sys", prefix_len=192)
             for _ in range(8)]
    cfg = SimConfig(pool_slots=4096, max_len=256, block_sizes=(16,), prefix_block_size=16)
    result = simulate(trace, cfg, ["paged-16", "prefix-16"], check=True)
    plain, shared = result.policies["paged-16"].peak, result.policies["prefix-16"].peak
    assert plain.tokens - shared.tokens == 7 * 192  # the prefix is held once instead of eight times


def test_waiting_requests_are_admitted_in_arrival_order_and_skipped_idle_steps():
    trace = [TraceRequest(arrival=100, prompt_len=4, output_len=2), TraceRequest(arrival=0, prompt_len=4, output_len=2)]
    cfg = SimConfig(pool_slots=64, max_len=32, block_sizes=(4,), prefix_block_size=None)
    r = simulate(trace, cfg, ["paged-4"]).policies["paged-4"]
    assert r.finished == 2 and r.steps == 103 and len(r.utilization) == 6  # steps 0-2 and 100-102


def test_memory_map_is_captured_for_the_draw_policy():
    trace = synthetic_trace(SyntheticConfig(num_requests=30, seed=2, max_len=256))
    cfg = SimConfig(pool_slots=2048, max_len=256, block_sizes=(16,), prefix_block_size=None)
    result = simulate(trace, cfg, draw_step=40, draw_policy="paged-16")
    mm = result.memory_map
    assert mm is not None and mm.policy == "paged-16" and mm.step >= 40 and mm.block_size == 16
    assert mm.entries and all(len(e.blocks) * 16 == e.capacity for e in mm.entries)
    with pytest.raises(InvalidInputError, match="ended"):
        simulate(trace, cfg, draw_step=10**6, draw_policy="contig-max")


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_sizes=(0,)), "block size must be positive"),
    (dict(block_sizes=(-4,)), "block size must be positive"),
    (dict(pool_slots=1000, max_len=512, block_sizes=(16,)), "whole number"),
    (dict(pool_slots=1024, max_len=2048), "cannot hold"),
])
def test_bad_config_is_a_user_error(kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        SimConfig(**kwargs)


def test_unknown_policy_and_too_long_prompt_are_user_errors():
    cfg = SimConfig(pool_slots=256, max_len=64, block_sizes=(4,), prefix_block_size=None)
    with pytest.raises(InvalidInputError, match="unknown policy"):
        simulate([TraceRequest(0, 4, 4)], cfg, ["paged-8"])
    with pytest.raises(InvalidInputError, match="request 0"):
        simulate([TraceRequest(0, 64, 4)], cfg)


def test_a_long_prefix_caching_replay_keeps_no_per_step_state():
    from pagedllm.sim.policies import make_policy
    from pagedllm.sim.requests import prepare
    from pagedllm.sim.simulate import Replay

    trace = prepare(synthetic_trace(SyntheticConfig(num_requests=40, seed=3, max_len=256)), 256)
    cfg = SimConfig(pool_slots=4096, max_len=256, block_sizes=(16,), prefix_block_size=16)
    replay = Replay(make_policy("prefix-16", cfg), trace, cfg.max_len)
    assert replay.run().finished == 40
    assert replay.policy.manager._unwritten == []  # each simulated step "ran": its hashed blocks hold K/V


def test_exact_policy_measures_external_fragmentation_against_the_heads_whole_reservation():
    # 32 slots, exact reservations: r0 takes 20 (prompt 10 + max_tokens 10), leaving one free run of 12.
    # The head of the queue would reserve 4 + 10 = 14 > 12: all 12 free slots are external fragmentation.
    cfg = SimConfig(pool_slots=32, max_len=32, block_sizes=(), prefix_block_size=None)
    policy = make_policy("contig-exact", cfg)
    r0, head = sim_requests([TraceRequest(0, 10, 10, max_tokens=10), TraceRequest(0, 4, 10, max_tokens=10)], 32)
    assert policy.admit(r0) and not policy.admit(head)
    rep = policy.report(head)
    assert (rep.external, rep.free) == (12, 0)
    assert policy.memory_map(0, head).next_need == 14


def test_preempted_request_goes_back_to_the_front_of_the_waiting_queue():
    # paged-4, 12 blocks: r0..r3 (8-token prompts) run; r4 arrives at step 4 and waits. At step 5 r0 needs a
    # block, r3 (the latest) is preempted and must wait *ahead of* r4, as vLLM requeues preempted requests first.
    trace = [TraceRequest(arrival=i, prompt_len=8, output_len=8) for i in range(4)]
    trace.append(TraceRequest(arrival=4, prompt_len=8, output_len=2))
    cfg = SimConfig(pool_slots=48, max_len=16, block_sizes=(4,), prefix_block_size=None)
    replay = Replay(make_policy("paged-4", cfg), prepare(trace, 16), 16, check=True)
    for step in range(6):
        replay._step(step)
    assert replay.result.preemptions == 1
    assert [r.seq_id for r in replay.waiting] == ["r3", "r4"]
    result = replay.run()
    assert result.finished == 5


def test_prefix_policy_forgets_the_token_lists_of_finished_requests():
    trace = [TraceRequest(arrival=i, prompt_len=12, output_len=6, prefix_group="sys", prefix_len=8) for i in range(6)]
    cfg = SimConfig(pool_slots=64, max_len=32, block_sizes=(), prefix_block_size=4)
    policy = make_policy("prefix-4", cfg)
    Replay(policy, prepare(trace, 32), 32, check=True).run()
    assert policy._tokens == {} and policy._final == {}


def test_drawing_an_idle_step_draws_the_next_busy_one():
    # r0 runs steps 0..2, nothing runs 3..9 (skipped), r1 arrives at 10: step 5 is drawn as step 10
    trace = [TraceRequest(arrival=0, prompt_len=4, output_len=2), TraceRequest(arrival=10, prompt_len=6, output_len=2)]
    cfg = SimConfig(pool_slots=32, max_len=16, block_sizes=(4,), prefix_block_size=None)
    mm = simulate(trace, cfg, ["paged-4"], draw_step=5, draw_policy="paged-4").memory_map
    assert mm is not None and mm.step == 10 and [e.used for e in mm.entries] == [6]


def test_means_are_over_busy_steps_only():
    # one request at a time, never two: mean running is exactly 1 although the drain steps record 0 running
    trace = [TraceRequest(arrival=0, prompt_len=4, output_len=3), TraceRequest(arrival=20, prompt_len=4, output_len=3)]
    cfg = SimConfig(pool_slots=32, max_len=16, block_sizes=(4,), prefix_block_size=None)
    r = simulate(trace, cfg, ["contig-max", "paged-4"])
    for p in r.policies.values():
        assert 0 in p.running  # the step each request finished in ran nothing
        assert p.mean_running == 1.0 and p.peak_running == 1
        # tokens 4,5,6 (steps 0..2 busy) for each request: mean 5 of 32 slots
        assert p.mean_pct("tokens") == pytest.approx(100 * 5 / 32)


def test_peak_is_the_first_step_that_reaches_the_peak_occupancy():
    # two identical requests, one after the other: both reach 6 tokens; the peak is the first one's step
    trace = [TraceRequest(arrival=0, prompt_len=4, output_len=3), TraceRequest(arrival=20, prompt_len=4, output_len=3)]
    cfg = SimConfig(pool_slots=32, max_len=16, block_sizes=(4,), prefix_block_size=None)
    r = simulate(trace, cfg, ["paged-4"]).policies["paged-4"]
    assert r.peak.tokens == 6 and r.peak_step == 2


def test_mean_external_fragmentation_is_summed_over_the_run():
    # exact reservations in 32 slots: r0 holds 20 while r1 (needs 14) waits on a free run of 12 for 10 steps
    trace = [TraceRequest(0, 10, 10, max_tokens=10), TraceRequest(0, 4, 10, max_tokens=10)]
    cfg = SimConfig(pool_slots=32, max_len=32, block_sizes=(), prefix_block_size=None)
    r = simulate(trace, cfg, ["contig-exact"]).policies["contig-exact"]
    summary = r.summary()
    assert r.sums["external"] == 12 * 10
    assert summary["waste_mean_pct"]["external"] == pytest.approx(100 * 12 * 10 / r.busy_steps / 32)
    assert summary["waste_mean_pct"]["total"] == pytest.approx(sum(r.mean_pct(k) for k in ("reservation", "internal", "external")))


def test_waste_at_peak_total_includes_external_fragmentation():
    trace = [TraceRequest(0, 10, 10, max_tokens=10), TraceRequest(0, 4, 10, max_tokens=10)]
    cfg = SimConfig(pool_slots=32, max_len=32, block_sizes=(), prefix_block_size=None)
    r = simulate(trace, cfg, ["contig-exact"]).policies["contig-exact"]
    at_peak = r.summary()["waste_at_peak_pct"]
    assert r.peak.tokens == 19 and at_peak["external"] == 100 * 12 / 32
    assert at_peak["total"] == pytest.approx(at_peak["reservation"] + at_peak["internal"] + at_peak["external"])
    assert at_peak["total"] == pytest.approx(100 * r.peak.waste / 32)
