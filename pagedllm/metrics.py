"""Prometheus metrics for the server: definitions, and their update from EngineStats / RequestMetrics.

Everything lives in a registry of its own (never prometheus_client's global one), so several
servers or tests in one process do not collide. The families vLLM's dashboards read are exposed under vLLM's
names too (`vllm:...`, VLLM_NAMES). Engine-wide figures (KV usage, queue sizes,
cumulative token counters) are read from the latest EngineStats at scrape time by a custom
collector; per-request latencies are observed into histograms when a request finishes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pagedllm.engine.outputs import RequestOutput, RequestMetrics
from pagedllm.engine.stats import EngineStats

PREFIX = "pagedllm_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                  0.5, 0.75, 1.0, 2.5)

# name -> (help, EngineStats attribute); gauges are point-in-time values.
GAUGES: dict[str, tuple[str, str]] = {
    "num_requests_running": ("Requests in the running batch.", "num_running"),
    "num_requests_waiting": ("Requests waiting to be scheduled.", "num_waiting"),
    "kv_blocks_total": ("Blocks in the KV pool.", "num_blocks"),
    "kv_blocks_used": ("KV blocks in use (ref count >= 1).", "blocks_used"),
    "kv_blocks_free": ("KV blocks free, including cached-free ones.", "blocks_free"),
    "kv_blocks_cached_free": ("Free KV blocks still holding a reusable prefix.", "blocks_cached_free"),
    "kv_block_usage_ratio": ("Fraction of KV blocks in use.", "block_occupancy"),
    "kv_tokens_stored": ("Token slots holding real tokens in used blocks.", "tokens_stored"),
    "kv_token_usage_ratio": ("Fraction of all KV token slots holding real tokens.", "token_occupancy"),
    "num_seqs_running_peak": ("Most sequences running in one engine step since start.", "running_seqs_peak"),
    "num_seqs_running_mean": ("Sequences running per engine step, mean over the steps that ran any.",
                              "running_seqs_mean"),
    "kv_slots_reserved": ("allocator=contiguous: token slots held by max-length reservations (0 when paged).",
                          "slots_reserved"),
}
# name (exposed with a _total suffix) -> (help, EngineStats attribute); cumulative since start.
COUNTERS: dict[str, tuple[str, str]] = {
    "prefix_cache_queries_tokens": ("Prompt tokens looked up in the prefix cache (once per request).",
                                    "prefix_queries_tokens"),
    "prefix_cache_hits_tokens": ("Prompt tokens served from the prefix cache (at first admission).",
                                 "prefix_hits_tokens"),
    "num_preemptions": ("Requests preempted for lack of KV blocks.", "num_preemptions"),
    "prompt_tokens": ("Prompt tokens computed (prefix cache hits excluded, recomputation after a preemption "
                      "included).", "prompt_tokens_total"),
    "generation_tokens": ("Tokens generated.", "generation_tokens_total"),
}


# pagedllm's families that vLLM's Grafana dashboards read, and their names there: each is exposed under both.
# Left out: pagedllm_prompt_tokens counts the prompt tokens computed, vLLM's each prompt's tokens once.
VLLM_NAMES: dict[str, str] = {
    "num_requests_running": "vllm:num_requests_running",
    "num_requests_waiting": "vllm:num_requests_waiting",
    "kv_block_usage_ratio": "vllm:kv_cache_usage_perc",  # a fraction in vLLM too
    "prefix_cache_queries_tokens": "vllm:prefix_cache_queries",
    "prefix_cache_hits_tokens": "vllm:prefix_cache_hits",
    "num_preemptions": "vllm:num_preemptions",
    "generation_tokens": "vllm:generation_tokens",
    "request_success": "vllm:request_success",
    "time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
    "e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
    "request_queue_time_seconds": "vllm:request_queue_time_seconds",
}


class _WithVllmNames:
    """What generate_latest reads: the server's families, collected once, then those of VLLM_NAMES again under
    vLLM's names (the same samples, so both names of a figure always agree)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> list[Metric]:
        families = list(self._registry.collect())
        return families + [_renamed(f, VLLM_NAMES[f.name.removeprefix(PREFIX)]) for f in families
                           if f.name.removeprefix(PREFIX) in VLLM_NAMES]


def _renamed(family: Metric, name: str) -> Metric:
    renamed = Metric(name, family.documentation, family.type, family.unit)
    renamed.samples = [sample._replace(name=name + sample.name[len(family.name):]) for sample in family.samples]
    return renamed


class _StatsCollector(Collector):
    def __init__(self, model_name: str) -> None:
        self._model_name = model_name
        self._stats: EngineStats | None = None

    def set(self, stats: EngineStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        if stats is None:
            return
        for name, (help_text, attr) in GAUGES.items():
            family = GaugeMetricFamily(PREFIX + name, help_text, labels=["model_name"])
            family.add_metric([self._model_name], float(getattr(stats, attr)))
            yield family
        for name, (help_text, attr) in COUNTERS.items():
            family = CounterMetricFamily(PREFIX + name, help_text, labels=["model_name"])
            family.add_metric([self._model_name], float(getattr(stats, attr)))
            yield family


class ServerMetrics:
    """The server's metrics. update/observe may be called from the engine thread."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self._stats = _StatsCollector(model_name)
        self.registry.register(self._stats)
        labels = ["model_name"]
        reg = self.registry
        self.request_success = Counter(PREFIX + "request_success", "Completions finished (n per request), by "
                                       "finish reason.", labels + ["finished_reason"], registry=reg)
        self.time_to_first_token = Histogram(
            PREFIX + "time_to_first_token_seconds", "Arrival to first output token.", labels,
            buckets=_LATENCY_BUCKETS, registry=reg)
        self.time_per_output_token = Histogram(
            PREFIX + "time_per_output_token_seconds", "Time between consecutive output tokens.", labels,
            buckets=_TOKEN_BUCKETS, registry=reg)
        self.e2e_request_latency = Histogram(
            PREFIX + "e2e_request_latency_seconds", "Arrival to finish.", labels,
            buckets=_LATENCY_BUCKETS, registry=reg)
        self.request_queue_time = Histogram(
            PREFIX + "request_queue_time_seconds", "Arrival to first scheduled.", labels,
            buckets=_LATENCY_BUCKETS, registry=reg)

    def update_from_stats(self, stats: EngineStats) -> None:
        self._stats.set(stats)

    def observe_finished(self, output: RequestOutput) -> None:
        reasons = [c.finish_reason or "abort" for c in output.outputs] or ["abort"]
        for reason in reasons:  # one per completion, as vLLM counts them
            self.request_success.labels(self.model_name, reason).inc()
        self.observe_metrics(output.metrics)

    def observe_metrics(self, m: RequestMetrics) -> None:
        name = self.model_name
        if m.first_token_time is not None:
            self.time_to_first_token.labels(name).observe(max(0.0, m.first_token_time - m.arrival_time))
        if m.first_scheduled_time is not None:
            self.request_queue_time.labels(name).observe(max(0.0, m.first_scheduled_time - m.arrival_time))
        if m.finished_time is not None:
            self.e2e_request_latency.labels(name).observe(max(0.0, m.finished_time - m.arrival_time))
        for earlier, later in zip(m.token_times, m.token_times[1:]):
            if later > earlier:  # with n > 1 several tokens share one step time
                self.time_per_output_token.labels(name).observe(later - earlier)

    def render(self) -> bytes:
        return generate_latest(_WithVllmNames(self.registry))
