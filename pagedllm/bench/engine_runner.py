"""Drive one LLMEngine through a workload, all requests submitted at once, and measure it."""

import statistics
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from pagedllm.bench.stats_math import Summary, summarize, tpot, ttft
from pagedllm.bench.workloads import BenchRequest, Workload
from pagedllm.config import EngineConfig, parse_memory_size
from pagedllm.engine.host_memory import minor_page_faults


@dataclass(slots=True)
class StepSample:
    """One engine step: how long it took, the prompt tokens it computed, and the KV pool after it."""

    time_s: float  # since the run started
    blocks_used: int
    tokens_stored: int
    running: int  # requests
    waiting: int
    running_seqs: int  # sequences that ran in this step
    step_s: float = 0.0  # the step's own wall time
    prompt_tokens: int = 0  # prompt tokens it computed (0: a step of decodes only)


@dataclass(slots=True)
class RunResult:
    label: str
    elapsed_s: float
    num_requests: int
    prompt_tokens: int
    output_tokens: int  # tokens the workload asked for (what the engine produced, counted per completion)
    steps: int = 0
    peak_blocks_used: int | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    prefix_hit_rate: float | None = None  # prefix-cache hit tokens / queried tokens
    num_preemptions: int | None = None
    mean_waste: float | None = None  # empty tail slots / used slots, averaged over steps
    peak_running_seqs: int | None = None  # sequences running in one step: the concurrency paging buys
    mean_running_seqs: float | None = None  # over the steps that ran any
    ttft: Summary | None = None
    tpot: Summary | None = None
    config: dict = field(default_factory=dict)
    samples: list[StepSample] = field(default_factory=list)
    cpu_s: float | None = None  # CPU time of the process over the run (all threads): robust on a shared machine
    page_faults: int | None = None  # minor page faults of the process over the run: memory touched anew

    @property
    def prompt_step_s(self) -> float | None:
        """Wall time of the steps that computed prompt tokens (None: no step figures)."""
        return sum(s.step_s for s in self.samples if s.prompt_tokens) if self.samples else None

    @property
    def decode_step_ms(self) -> float | None:
        """Median wall time of the steps of decodes only, in ms (None: there were none)."""
        decodes = [s.step_s for s in self.samples if not s.prompt_tokens]
        return statistics.median(decodes) * 1e3 if decodes else None

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_s


def sampling_params(request: BenchRequest, seed: int | None):
    """Greedy for single completions; temperature 1 for n > 1; beam search for beam; never stops early."""
    from pagedllm.sampling_params import SamplingParams

    if request.beam:
        return SamplingParams(n=1, beam_width=request.n, use_beam_search=True, temperature=0.0,
                              max_tokens=request.output_len, ignore_eos=True)  # fmt: skip
    temperature = 0.0 if request.n == 1 else 1.0
    return SamplingParams(n=request.n, temperature=temperature, seed=seed, max_tokens=request.output_len,
                          ignore_eos=True)  # fmt: skip


def config_summary(config: EngineConfig) -> dict:
    return {
        "dtype": config.dtype,
        "block_size": config.block_size,
        "kv_cache_memory": config.kv_cache_memory,
        "kv_cache_bytes": parse_memory_size(config.kv_cache_memory),
        "num_blocks": config.num_blocks,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "enable_prefix_caching": config.enable_prefix_caching,
        "allocator": getattr(config, "allocator", "paged"),
        "preemption_mode": config.preemption_mode,
        "attention_impl": config.attention_impl,
        "tensor_parallel_size": getattr(config, "tensor_parallel_size", 1),
        "device": config.device,
        "gpu_memory_utilization": config.gpu_memory_utilization,  # sizes the pool on CUDA, not kv_cache_memory
        "enforce_eager": config.enforce_eager,
    }


def resolved_choices(engine) -> dict:
    """What "auto" stood for in this run (dtype, attention path)."""
    return {"resolved_dtype": str(engine.dtype).removeprefix("torch."),
            "resolved_attention_impl": engine.runner.attention_impl}  # fmt: skip


def warm_up(engine) -> None:
    """One short request so first-step costs (thread pools, allocator growth) stay out of the timing."""
    from pagedllm.sampling_params import SamplingParams

    vocab = engine.model_config.vocab_size
    engine.add_request("bench-warmup", [min(16 + i, vocab - 1) for i in range(24)],
                       SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # fmt: skip
    while engine.has_unfinished_requests():
        engine.step()


def run_engine(engine, workload: Workload, label: str, progress: bool = True, seeded: bool = True) -> RunResult:
    """Submit every request at once, step to the end, poll the KV pool after each step. `seeded`: each
    sampled request has its own seed (workload seed + its index)."""
    before = engine.stats()
    start, cpu_start, faults_start = time.perf_counter(), time.process_time(), minor_page_faults()
    for i, request in enumerate(workload.requests):
        seed = workload.seed + i if seeded else None
        engine.add_request(f"bench-{i}", request.prompt, sampling_params(request, seed))
    samples, finished = _step_to_end(engine, len(workload.requests), start, progress, label)
    elapsed = time.perf_counter() - start
    result = _result(engine, workload, label, elapsed, before, samples, finished)
    result.cpu_s = time.process_time() - cpu_start
    result.page_faults = minor_page_faults() - faults_start
    return result


def _step_to_end(engine, count: int, start: float, progress: bool, label: str) -> tuple[list[StepSample], list]:
    samples, finished = [], []
    with tqdm(total=count, desc=label, unit="req", disable=not progress, leave=False) as bar:
        while engine.has_unfinished_requests():
            step_start, prompt_before = time.perf_counter(), engine.prompt_tokens_total
            for output in engine.step():
                if output.finished:
                    finished.append(output)
                    bar.update(1)
            now = time.perf_counter()
            s = engine.stats()
            samples.append(StepSample(now - start, s.blocks_used, s.tokens_stored, s.num_running, s.num_waiting,
                                      s.running_seqs_last, now - step_start,
                                      engine.prompt_tokens_total - prompt_before))  # fmt: skip
    return samples, finished


def _result(engine, workload, label, elapsed, before, samples, finished) -> RunResult:
    after = engine.stats()
    queries = after.prefix_queries_tokens - before.prefix_queries_tokens
    hits = after.prefix_hits_tokens - before.prefix_hits_tokens
    ttfts, tpots = _latencies(finished)
    return RunResult(
        label=label,
        elapsed_s=elapsed,
        num_requests=len(workload.requests),
        prompt_tokens=sum(len(r.prompt_token_ids) for r in finished),
        output_tokens=sum(len(c.token_ids) for r in finished for c in r.outputs),
        steps=len(samples),
        peak_blocks_used=max((s.blocks_used for s in samples), default=0),
        num_blocks=after.num_blocks,
        block_size=after.block_size,
        prefix_hit_rate=hits / queries if queries else 0.0,
        num_preemptions=after.num_preemptions - before.num_preemptions,
        mean_waste=_mean_waste(samples, after.block_size),
        peak_running_seqs=max((s.running_seqs for s in samples), default=0),
        mean_running_seqs=_mean_running(samples),
        ttft=summarize(ttfts),
        tpot=summarize(tpots),
        config=config_summary(engine.config) | resolved_choices(engine),
        samples=samples,
    )


def _latencies(finished: list) -> tuple[list[float], list[float]]:
    ttfts, tpots = [], []
    for out in finished:
        m = out.metrics
        if m.first_token_time is not None:
            ttfts.append(ttft(m.arrival_time, m.first_token_time))
        if m.token_times:
            value = tpot(m.token_times[0], m.token_times[-1], len(m.token_times))
            if value is not None:
                tpots.append(value)
    return ttfts, tpots


def _mean_waste(samples: list[StepSample], block_size: int) -> float:
    """Empty tail slots / used slots, averaged over the steps that held any block."""
    fractions = [(s.blocks_used * block_size - s.tokens_stored) / (s.blocks_used * block_size)
                 for s in samples if s.blocks_used]  # fmt: skip
    return sum(fractions) / len(fractions) if fractions else 0.0


def _mean_running(samples: list[StepSample]) -> float:
    """Sequences per step, over the steps that ran any (as the engine's own running_seqs_mean)."""
    busy = [s.running_seqs for s in samples if s.running_seqs]
    return sum(busy) / len(busy) if busy else 0.0
