"""Serving metrics from the client's timestamps: TTFT, TPOT, ITL, end-to-end latency, throughput.

TTFT runs from the moment the request was sent to the first chunk that carries text. TPOT is the
mean gap per output token after the first, per completion: with n > 1 samples streamed together,
each sample counts output_tokens / n tokens and the request's TPOT is the mean over its samples.
ITL is the gap between consecutive chunks of one completion; a chunk may carry more than one
token when the server coalesces them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pagedllm.bench.serve_client import RequestRecord
from pagedllm.bench.stats_math import Summary, e2e_latency, itl, summarize, tpot, ttft


@dataclass(slots=True)
class ServeMetrics:
    completed: int
    failed: int
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: Summary
    tpot_s: Summary
    itl_s: Summary
    e2e_s: Summary
    errors: list[str] = field(default_factory=list)  # the first few, for the report

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def total_token_throughput(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "completed": self.completed, "failed": self.failed, "duration_s": self.duration_s,
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "request_throughput": self.request_throughput, "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "ttft_s": self.ttft_s.to_dict(), "tpot_s": self.tpot_s.to_dict(),
            "itl_s": self.itl_s.to_dict(), "e2e_s": self.e2e_s.to_dict(), "errors": self.errors,
        }


def request_tpot(record: RequestRecord) -> float | None:
    """Seconds per output token after the first, averaged over the request's completions."""
    per_sample = record.output_tokens // max(record.n, 1)
    values = [tpot(times[0], times[-1], per_sample) for times in record.choice_times.values()]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def request_itls(record: RequestRecord) -> list[float]:
    return [gap for times in record.choice_times.values() for gap in itl(times)]


def compute_metrics(records: Sequence[RequestRecord], duration_s: float, max_errors: int = 5) -> ServeMetrics:
    good = [r for r in records if r.ok]
    bad = [r for r in records if not r.ok]
    tpots = [t for t in (request_tpot(r) for r in good) if t is not None]
    return ServeMetrics(
        completed=len(good),
        failed=len(bad),
        duration_s=duration_s,
        prompt_tokens=sum(r.prompt_tokens for r in good),
        output_tokens=sum(r.output_tokens for r in good),
        ttft_s=summarize([ttft(r.start, r.chunk_times[0]) for r in good]),
        tpot_s=summarize(tpots),
        itl_s=summarize([gap for r in good for gap in request_itls(r)]),
        e2e_s=summarize([e2e_latency(r.start, r.end) for r in good]),
        errors=[f"request {r.index}: {r.error or 'no output'}" for r in bad[:max_errors]],
    )
