"""Shared pieces of the tensor-parallel tests: engines on tiny models, comparing their seeded draws, and
finding a process's children."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch

from pagedllm import LLM, SamplingParams
from pagedllm.engine import sampler

ENGINE_OPTIONS = dict(dtype="float32", num_blocks=256, block_size=4, max_num_batched_tokens=4096)


def make_llm(model: Path, size: int, **options) -> LLM:
    return LLM(model=str(model), tensor_parallel_size=size, **{**ENGINE_OPTIONS, **options})


def completions(llm: LLM, prompts, params: SamplingParams) -> list[list[tuple[list[int], float]]]:
    """Per prompt, per completion: its token ids and cumulative logprob."""
    return [[(c.token_ids, c.cumulative_logprob) for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]


def same_completions(a, b, logprob_tol: float = 1e-3) -> bool:
    if [[ids for ids, _ in req] for req in a] != [[ids for ids, _ in req] for req in b]:
        return False
    return all(abs(x - y) <= logprob_tol for ra, rb in zip(a, b) for (_, x), (_, y) in zip(ra, rb))


@dataclass
class Draws:
    """The sampler's random draws in the order it made them: per draw, its completion's stream (numbered by
    first appearance), the row's logits after temperature, its uniform and the token it picked."""

    streams: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    uniforms: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def of_stream(self, stream: int) -> list[tuple[torch.Tensor, float, int]]:
        return [(x, u, t) for s, x, u, t in zip(self.streams, self.logits, self.uniforms, self.tokens) if s == stream]


@contextmanager
def recorded_draws() -> Iterator[Draws]:
    """Records every random draw the sampler makes in this process inside the block (the driver samples for
    every tensor-parallel size), whichever path draws it (the compiled call or torch's ops). Each seeded
    completion has its own generator, which names its stream."""
    draws, numbers, sample_random, uniforms = Draws(), {}, sampler._sample_random, sampler._uniforms

    def drawn_uniforms(rows: list, device: torch.device) -> torch.Tensor:
        u = uniforms(rows, device)
        draws.uniforms.extend(u.tolist())
        return u

    def random_tokens(logits: torch.Tensor, rows: list) -> torch.Tensor:
        draws.streams.extend(numbers.setdefault(id(row.generator), len(numbers)) for row in rows)
        temperature = torch.tensor([row.params.temperature for row in rows], dtype=logits.dtype)
        draws.logits.extend((logits / temperature[:, None]).detach().clone())
        tokens = sample_random(logits, rows)
        draws.tokens.extend(tokens.tolist())
        return tokens

    with mock.patch.object(sampler, "_uniforms", drawn_uniforms), mock.patch.object(sampler, "_sample_random", random_tokens):
        yield draws


def rounding_flips(a: Draws, b: Draws, logits_tol: float) -> int:
    """How many completions' picks differ between two runs, asserting that every difference is rounding.

    Stream by stream, both runs must draw the same uniforms from logits within `logits_tol` of each other,
    and pick the same tokens up to the stream's first difference, if any. A token is a fixed function of its
    logits and uniform, so a difference under those conditions is a pick whose uniform (or top-p cut) lies
    within rounding of the edge between two tokens' slices. A stream's draws after its flip are not
    compared: its context differs from there.
    """
    streams = sorted(set(a.streams))
    assert streams == sorted(set(b.streams)), "the runs sampled different completions"
    flips = 0
    for stream in streams:
        ours, theirs = a.of_stream(stream), b.of_stream(stream)
        for i, ((x, ux, tx), (y, uy, ty)) in enumerate(zip(ours, theirs)):
            assert ux == uy, f"stream {stream}, draw {i}: the runs drew different uniforms"
            torch.testing.assert_close(y, x, atol=logits_tol, rtol=0, msg=lambda m: f"stream {stream}, draw {i}: {m}")
            if tx != ty:
                flips += 1
                break
        else:
            assert len(ours) == len(theirs), f"stream {stream}: different lengths"
    return flips


def children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (from /proc), but multiprocessing's resource tracker, which the
    first spawn starts and which lives as long as the process."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:  # the process ended while we looked
            continue
        if int(fields.get("PPid", "0")) != pid or fields.get("State", "").startswith("Z"):
            continue
        cmdline = (status.parent / "cmdline").read_bytes() if (status.parent / "cmdline").exists() else b""
        if b"resource_tracker" not in cmdline:
            found.append(int(status.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
