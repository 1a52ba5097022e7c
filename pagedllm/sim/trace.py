"""Request traces: a JSONL file, or a seeded synthetic generator shaped like ShareGPT chat traffic.

One JSON object per line:

    {"arrival": 12, "prompt_len": 161, "output_len": 338}
    {"arrival": 12, "prompt_len": 90, "output_len": 40, "prefix_group": "sys", "prefix_len": 64, "max_tokens": 256}

- arrival       step at which the request arrives (int >= 0); lines need not be sorted
- prompt_len    prompt tokens (int >= 1)
- output_len    tokens the request will generate if not stopped earlier (int >= 1)
- max_tokens    optional generation limit (int >= 1); default max_len - prompt_len
- prefix_group  optional int or str: requests of one group share prompt text, so their
                prompts can share KV blocks through the prefix cache
- prefix_len    optional, with prefix_group: how many leading prompt tokens are the group's
                shared text (0..prompt_len); default: the whole prompt, i.e. the group's
                prompts are all prefixes of one common text
Unknown keys are ignored; blank lines are skipped.
"""

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from pagedllm.checks import is_int
from pagedllm.errors import InvalidInputError

DEFAULT_MAX_LEN = 2048


@dataclass(slots=True)
class TraceRequest:
    arrival: int
    prompt_len: int
    output_len: int
    max_tokens: int | None = None
    prefix_group: int | str | None = None
    prefix_len: int | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"arrival": self.arrival, "prompt_len": self.prompt_len, "output_len": self.output_len}
        for key in ("max_tokens", "prefix_group", "prefix_len"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


# --- parsing ------------------------------------------------------------------------------------
def _int_field(obj: dict, key: str, minimum: int, required: bool) -> int | None:
    if key not in obj:
        if required:
            raise ValueError(f'missing field "{key}"')
        return None
    value = obj[key]
    if not is_int(value):
        raise ValueError(f'"{key}" must be an integer, got {value!r}')
    if value < minimum:
        kind = "negative" if value < 0 else "too small"
        raise ValueError(f'"{key}" is {kind}: {value} (must be >= {minimum})')
    return value


def parse_request(obj: object) -> TraceRequest:
    """One decoded JSON line -> TraceRequest; ValueError says what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    req = TraceRequest(
        arrival=_int_field(obj, "arrival", 0, True),  # type: ignore[arg-type]
        prompt_len=_int_field(obj, "prompt_len", 1, True),  # type: ignore[arg-type]
        output_len=_int_field(obj, "output_len", 1, True),  # type: ignore[arg-type]
        max_tokens=_int_field(obj, "max_tokens", 1, False),
        prefix_len=_int_field(obj, "prefix_len", 0, False),
    )
    group = obj.get("prefix_group")
    if group is not None and not (is_int(group) or isinstance(group, str)):
        raise ValueError(f'"prefix_group" must be an integer or a string, got {group!r}')
    req.prefix_group = group
    if req.prefix_len is not None:
        if group is None:
            raise ValueError('"prefix_len" given without "prefix_group"')
        if req.prefix_len > req.prompt_len:
            raise ValueError(f'"prefix_len" {req.prefix_len} exceeds "prompt_len" {req.prompt_len}')
    return req


def load_trace(path: str | Path) -> list[TraceRequest]:
    """Read a JSONL trace; any bad line raises InvalidInputError naming file, line and problem."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except OSError as exc:
        raise InvalidInputError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidInputError(f"{path}: not a UTF-8 text file") from None
    requests = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            requests.append(parse_request(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{path}:{lineno}: bad JSON: {exc.msg} (column {exc.colno})") from None
        except ValueError as exc:
            raise InvalidInputError(f"{path}:{lineno}: {exc}") from None
    if not requests:
        raise InvalidInputError(f"{path}: the trace holds no requests")
    return requests


def save_trace(requests: list[TraceRequest], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for req in requests:
            f.write(json.dumps(req.to_json()) + "\n")


# --- synthetic ----------------------------------------------------------------------------------
@dataclass(slots=True)
class SyntheticConfig:
    """Defaults mimic the ShareGPT trace of the PagedAttention paper (inputs ~161, outputs ~338 tokens).

    Prompt and output lengths are lognormal with the given mean and log-space sigma (long right
    tails), rounded, at least 1, then clipped so prompt + output <= max_len (prompt first, to
    max_len - 1, then output). Arrivals are a Poisson process of `rate` requests per step.
    A `shared_fraction` of the requests, chosen at random, start with one common system prompt
    of `system_prompt_len` tokens (prefix_group "system", prefix_len min(system_prompt_len, prompt_len)).
    """

    num_requests: int = 1000
    seed: int = 0
    rate: float = 0.5  # requests per step: more than the default pool serves, so requests wait
    max_len: int = DEFAULT_MAX_LEN
    prompt_mean: float = 160.0
    prompt_sigma: float = 1.0
    output_mean: float = 340.0
    output_sigma: float = 0.8
    shared_fraction: float = 0.3
    system_prompt_len: int = 64

    def __post_init__(self) -> None:
        if self.num_requests <= 0:
            raise InvalidInputError(f"number of requests must be positive, got {self.num_requests}")
        if not self.rate > 0:
            raise InvalidInputError(f"arrival rate must be positive, got {self.rate}")
        if self.max_len < 2:
            raise InvalidInputError(f"max_len must be at least 2, got {self.max_len}")
        if not 0.0 <= self.shared_fraction <= 1.0:
            raise InvalidInputError(f"shared fraction must lie in [0, 1], got {self.shared_fraction}")


def _lognormal_len(rng: random.Random, mean: float, sigma: float) -> int:
    mu = math.log(mean) - sigma * sigma / 2  # so that E[exp(N(mu, sigma))] = mean
    return max(1, round(rng.lognormvariate(mu, sigma)))


def synthetic_trace(cfg: SyntheticConfig) -> list[TraceRequest]:
    rng = random.Random(cfg.seed)
    t = 0.0
    out = []
    for _ in range(cfg.num_requests):
        t += rng.expovariate(cfg.rate)
        prompt = min(_lognormal_len(rng, cfg.prompt_mean, cfg.prompt_sigma), cfg.max_len - 1)
        output = min(_lognormal_len(rng, cfg.output_mean, cfg.output_sigma), cfg.max_len - prompt)
        req = TraceRequest(arrival=int(t), prompt_len=prompt, output_len=output)
        if rng.random() < cfg.shared_fraction:
            req.prefix_group, req.prefix_len = "system", min(cfg.system_prompt_len, prompt)
        out.append(req)
    return out
