"""Benchmark workloads: seeded synthetic request sets, or a JSONL file of requests.

Every request runs to its full output length (ignore_eos) so every engine does the same work.
Synthetic prompts are random token ids drawn from the model's vocabulary, skipping the lowest ids
(special tokens in most vocabularies).
"""

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from pagedllm.checks import is_int
from pagedllm.bench.stats_math import Summary, summarize
from pagedllm.errors import InvalidInputError

WORKLOADS = ("mixed", "sharegpt-like", "shared-prefix", "parallel-sampling", "beam")
DEFAULT_NUM_REQUESTS = {"mixed": 64, "sharegpt-like": 64, "shared-prefix": 32, "parallel-sampling": 8, "beam": 8}
_FIRST_ID = 16  # lowest token id used for random prompts


@dataclass(slots=True)
class BenchRequest:
    prompt: list[int] | str  # token ids, or text the engine tokenizes
    output_len: int  # tokens generated per completion (forced: ignore_eos)
    n: int = 1  # parallel samples (temperature 1) or, with beam, the beam width
    beam: bool = False

    @property
    def num_output_tokens(self) -> int:
        """Tokens this request is asked to produce: n completions for sampling, one for beam search."""
        return self.output_len if self.beam else self.output_len * self.n


@dataclass(slots=True)
class Workload:
    name: str
    seed: int
    requests: list[BenchRequest] = field(default_factory=list)

    def prompt_lens(self, tokenize=None) -> list[int]:
        return [len(r.prompt) if tokenize is None or not isinstance(r.prompt, str) else len(tokenize(r.prompt))
                for r in self.requests]  # fmt: skip

    def length_stats(self, tokenize=None) -> dict:
        prompts = self.prompt_lens(tokenize)
        outputs = [r.output_len for r in self.requests]
        return {
            "num_requests": len(self.requests),
            "prompt_tokens": sum(prompts),
            "output_tokens": sum(r.num_output_tokens for r in self.requests),
            "prompt_len": _min_mean_max(summarize(prompts)),
            "output_len": _min_mean_max(summarize(outputs)),
            "n": sorted({r.n for r in self.requests}),
            "beam": any(r.beam for r in self.requests),
        }


def _min_mean_max(s: Summary) -> dict[str, float]:
    return {"min": s.min, "mean": round(s.mean, 1), "max": s.max}


@dataclass(slots=True)
class WorkloadSpec:
    """What to build: a named synthetic workload (or a JSONL path) and its size."""

    name: str  # one of WORKLOADS, or a path to a .jsonl file
    num_requests: int | None = None  # None: the workload's default
    seed: int = 0
    vocab_size: int = 49152
    max_model_len: int = 2048
    prefix_len: int = 384  # shared-prefix only


def build_workload(spec: WorkloadSpec) -> Workload:
    if spec.name not in WORKLOADS:
        return load_jsonl(spec.name, spec.max_model_len)
    count = DEFAULT_NUM_REQUESTS[spec.name] if spec.num_requests is None else spec.num_requests
    if count <= 0:
        raise InvalidInputError(f"--num-requests must be positive, got {count}")
    if spec.prefix_len < 0:
        raise InvalidInputError(f"--prefix-len must be >= 0, got {spec.prefix_len}")
    rng = random.Random(spec.seed)
    make = _GENERATORS[spec.name]
    requests = [_clip(r, spec.max_model_len) for r in make(rng, count, spec)]
    return Workload(spec.name, spec.seed, requests)


def _clip(r: BenchRequest, max_model_len: int) -> BenchRequest:
    """Fit prompt + output into the model's length: output at most half of it, then cut the prompt's tail."""
    r.output_len = min(r.output_len, max(1, max_model_len // 2))
    del r.prompt[max_model_len - r.output_len :]
    return r


def _ids(rng: random.Random, count: int, vocab: int) -> list[int]:
    low = min(_FIRST_ID, vocab - 1)
    return [rng.randrange(low, vocab) for _ in range(count)]


def _mixed(rng: random.Random, count: int, spec: WorkloadSpec) -> list[BenchRequest]:
    """Prompts 16-512 tokens, outputs 16-128, uniform."""
    return [BenchRequest(_ids(rng, rng.randint(16, 512), spec.vocab_size), rng.randint(16, 128)) for _ in range(count)]


def _sharegpt_like(rng: random.Random, count: int, spec: WorkloadSpec) -> list[BenchRequest]:
    """The memory simulator's chat-shaped lognormal lengths, clipped so prompt + output fits the model."""
    from pagedllm.sim.trace import SyntheticConfig, synthetic_trace

    trace = synthetic_trace(SyntheticConfig(num_requests=count, seed=spec.seed, max_len=spec.max_model_len,
                                            shared_fraction=0.0))  # fmt: skip
    return [BenchRequest(_ids(rng, t.prompt_len, spec.vocab_size), t.output_len) for t in trace]


def _shared_prefix(rng: random.Random, count: int, spec: WorkloadSpec) -> list[BenchRequest]:
    """One long common prefix, short unique suffixes (16-64), 64 output tokens each."""
    prefix = _ids(rng, spec.prefix_len, spec.vocab_size)
    return [BenchRequest(prefix + _ids(rng, rng.randint(16, 64), spec.vocab_size), 64) for _ in range(count)]


def _parallel_sampling(rng: random.Random, count: int, spec: WorkloadSpec) -> list[BenchRequest]:
    """Prompts of 256 tokens, n = 4 samples of 64 tokens each."""
    return [BenchRequest(_ids(rng, 256, spec.vocab_size), 64, n=4) for _ in range(count)]


def _beam(rng: random.Random, count: int, spec: WorkloadSpec) -> list[BenchRequest]:
    """Prompts of 256 tokens, beam search of width 4, 64 tokens."""
    return [BenchRequest(_ids(rng, 256, spec.vocab_size), 64, n=4, beam=True) for _ in range(count)]


_GENERATORS = {
    "mixed": _mixed,
    "sharegpt-like": _sharegpt_like,
    "shared-prefix": _shared_prefix,
    "parallel-sampling": _parallel_sampling,
    "beam": _beam,
}


def check_fits(r: BenchRequest, max_model_len: int) -> None:
    """A request of token ids must fit the model's length (text prompts are checked once tokenized)."""
    if isinstance(r.prompt, list) and len(r.prompt) + r.output_len > max_model_len:
        raise InvalidInputError(
            f"a request of {len(r.prompt)} prompt + {r.output_len} output tokens does not fit the model's "
            f"length {max_model_len}; raise --max-model-len or shorten the workload"
        )


# --- JSONL --------------------------------------------------------------------------------------
def load_jsonl(path: str | Path, max_model_len: int) -> Workload:
    """One request per line: {"prompt": "text" | [ids], "max_tokens": 64, "n": 1, "beam": false}."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"unknown workload {str(path)!r}: use one of {', '.join(WORKLOADS)} or a .jsonl file")
    requests = []
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors) is not an error
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            requests.append(_parse_line(line, f"{path}:{lineno}"))
    if not requests:
        raise InvalidInputError(f"{path}: no requests")
    for r in requests:
        check_fits(r, max_model_len)
    return Workload(str(path), 0, requests)


def _parse_line(line: str, where: str) -> BenchRequest:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{where}: bad JSON: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise InvalidInputError(f"{where}: expected a JSON object")
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and prompt and all(map(is_int, prompt)):
        pass
    elif not (isinstance(prompt, str) and prompt):
        raise InvalidInputError(f'{where}: "prompt" must be non-empty text or a list of token ids')
    max_tokens, n = obj.get("max_tokens", 64), obj.get("n", 1)
    for key, value in (("max_tokens", max_tokens), ("n", n)):
        if not is_int(value) or value < 1:
            raise InvalidInputError(f'{where}: "{key}" must be an integer >= 1, got {value!r}')
    beam = obj.get("beam", False)
    if not isinstance(beam, bool):
        raise InvalidInputError(f'{where}: "beam" must be true or false, got {beam!r}')
    return BenchRequest(prompt, max_tokens, n=n, beam=beam)


def save_jsonl(workload: Workload, path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in workload.requests:
            f.write(json.dumps({"prompt": r.prompt, "max_tokens": r.output_len, "n": r.n, "beam": r.beam}) + "\n")


def add_sample_seeds_option(group: argparse._ArgumentGroup) -> None:
    """--no-sample-seeds (`seed_samples`), the same for every bench command that sends n > 1 requests."""
    group.add_argument("--no-sample-seeds", dest="seed_samples", action="store_false",
                       help="sample n > 1 requests without a per-request seed (vLLM 0.32 CPU fails on seeded "
                            "requests whose prefill is chunked)")
