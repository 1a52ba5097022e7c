"""The Prometheus endpoint's figures: each gauge and counter is the EngineStats field its help text names, and the
request histograms observe what their names say (latencies from arrival, as vLLM measures them)."""

from dataclasses import fields

from prometheus_client.parser import text_string_to_metric_families

from pagedllm.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from pagedllm.engine.stats import EngineStats
from pagedllm.metrics import COUNTERS, GAUGES, ServerMetrics


def distinct_stats() -> EngineStats:
    """Every field a different value, so a gauge wired to the wrong field shows."""
    values = {f.name: i + 1 for i, f in enumerate(fields(EngineStats))}
    values["token_occupancy"], values["block_occupancy"], values["running_seqs_mean"] = 0.25, 0.75, 2.5
    return EngineStats(**values)


def samples(metrics: ServerMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_gauge_and_counter_reads_its_own_engine_stats_field():
    metrics = ServerMetrics("m")
    stats = distinct_stats()
    metrics.update_from_stats(stats)
    got = samples(metrics)
    label = (("model_name", "m"),)
    expected = {
        "kv_blocks_free": stats.blocks_free, "kv_blocks_cached_free": stats.blocks_cached_free,
        "kv_block_usage_ratio": stats.block_occupancy, "kv_token_usage_ratio": stats.token_occupancy,
        "kv_slots_reserved": stats.slots_reserved, "kv_tokens_stored": stats.tokens_stored,
        "num_seqs_running_peak": stats.running_seqs_peak, "num_seqs_running_mean": stats.running_seqs_mean,
    }
    for name, value in expected.items():
        assert got[("pagedllm_" + name, label)] == value, name
    for name, (_, attr) in GAUGES.items():
        assert got[("pagedllm_" + name, label)] == getattr(stats, attr)
    assert got[("pagedllm_prompt_tokens_total", label)] == stats.prompt_tokens_total
    assert got[("pagedllm_generation_tokens_total", label)] == stats.generation_tokens_total
    for name, (_, attr) in COUNTERS.items():
        assert got[("pagedllm_" + name + "_total", label)] == getattr(stats, attr)


def test_empty_tail_slots_are_the_used_blocks_slots_without_a_token():
    stats = distinct_stats()
    stats.num_blocks, stats.block_size, stats.blocks_used, stats.tokens_stored = 100, 16, 10, 150
    assert stats.empty_tail_slots == 10


def lab(**labels: str) -> tuple:
    return tuple(sorted({"model_name": "m", **labels}.items()))


def completion(i, reason):
    return CompletionOutput(i, "", [], None, reason)


def test_finished_request_latencies_and_reasons():
    metrics = ServerMetrics("m")
    m = RequestMetrics(arrival_time=100.0, first_scheduled_time=101.0, first_token_time=103.0,
                       token_times=[103.0, 103.0, 104.0, 106.0], finished_time=107.0)
    metrics.observe_finished(RequestOutput("a", None, [1], [completion(0, "stop"), completion(1, None)], True, m))
    metrics.observe_finished(RequestOutput("b", None, [1], [], True, RequestMetrics(arrival_time=0.0)))
    got = samples(metrics)
    assert got[("pagedllm_request_success_total", lab(finished_reason="stop"))] == 1
    assert got[("pagedllm_request_success_total", lab(finished_reason="abort"))] == 2  # None and no output
    assert ("pagedllm_request_success_total", lab(finished_reason="None")) not in got
    assert got[("pagedllm_time_to_first_token_seconds_sum", lab())] == 3.0  # from arrival, as vLLM
    assert got[("pagedllm_request_queue_time_seconds_sum", lab())] == 1.0
    assert got[("pagedllm_e2e_request_latency_seconds_sum", lab())] == 7.0
    # inter-token gaps 1 and 2; the two tokens of one step (n > 1) are not a gap of 0
    assert got[("pagedllm_time_per_output_token_seconds_count", lab())] == 2
    assert got[("pagedllm_time_per_output_token_seconds_sum", lab())] == 3.0
    # latency histograms reach minutes, the per-token one is fine-grained
    assert ("pagedllm_time_to_first_token_seconds_bucket", lab(le="160.0")) in got
    assert ("pagedllm_time_per_output_token_seconds_bucket", lab(le="0.001")) in got
    assert got[("pagedllm_time_to_first_token_seconds_bucket", lab(le="2.5"))] == 0
    assert got[("pagedllm_time_to_first_token_seconds_bucket", lab(le="5.0"))] == 1
