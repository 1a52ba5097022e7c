"""Beam search bookkeeping for one request: which beams live, fork, end, and the best hypotheses.

No KV here. Each step tells the engine, in this order, what to do with the
sequences it holds for the beams:
  1. forks: (parent_id, child_id) — give child a copy-on-write fork of the parent's KV;
  2. freed: ids whose sequences end — free their blocks;
  3. live: for every live beam, append its last token (the parent's id is
     reused by its first child, so that one continues in place).

Semantics follow transformers' `_beam_search` so results match it token for
token: 2·W candidates (more with several stop ids), only the top W candidates
may finish, a hypothesis scores cum_logprob / generated_len ** length_penalty
(generated_len counts the EOS token, not the prompt), and the search stops
when no live beam can beat the worst kept hypothesis (early_stopping=False /
"never" heuristics) or, with early_stopping=True, once W hypotheses exist.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
import itertools

import torch

from pagedllm.engine.device import to_device
from pagedllm.engine.sampler import BeamCandidates, beam_candidates
from pagedllm.sampling_params import SamplingParams


@dataclass(slots=True)
class Beam:
    beam_id: int
    token_ids: list[int]  # generated tokens only
    cum_logprob: float


@dataclass(slots=True)
class Hypothesis:
    token_ids: list[int]  # ends with the stop token when finish_reason == "stop"
    cum_logprob: float
    score: float  # cum_logprob / len(token_ids) ** length_penalty
    finish_reason: str  # "stop" or "length"


@dataclass(slots=True)
class BeamStep:
    forks: list[tuple[int, int]] = field(default_factory=list)  # (parent_id, child_id)
    freed: list[int] = field(default_factory=list)
    live: list[Beam] = field(default_factory=list)
    done: bool = False
    num_finished: int = 0  # beams that ended with this step's token (each became a hypothesis, kept or not)


class BeamSearch:
    """Beam search state of one request. Feed it the logits of `live` beams each step."""

    def __init__(
        self,
        params: SamplingParams,
        eos_token_ids: set[int],
        max_tokens: int,
        root_id: int = 0,
        new_id: Callable[[], int] | None = None,
    ) -> None:
        self.width = params.beam_width or params.n
        self.n = params.n
        self.length_penalty = params.length_penalty
        self.early_stopping = params.early_stopping
        self.min_tokens = params.min_tokens
        self.max_tokens = max_tokens
        self.stop_ids = params.stop_ids(eos_token_ids)
        self.live: list[Beam] = [Beam(root_id, [], 0.0)]
        self.hypotheses: list[Hypothesis] = []  # best first, at most `width`
        self.done = False
        counter: Iterator[int] = itertools.count(root_id + 1)
        self._new_id = new_id or (lambda: next(counter))

    @property
    def num_candidates(self) -> int:
        return max(2, 1 + len(self.stop_ids)) * self.width

    def step(self, logits: torch.Tensor) -> BeamStep:
        """logits: [len(self.live), V], row i for self.live[i]."""
        if self.done:
            raise RuntimeError("beam search already finished")
        banned = sorted(self.stop_ids) if len(self.live[0].token_ids) < self.min_tokens else []
        cum = torch.tensor([b.cum_logprob for b in self.live], dtype=torch.float32)
        cum = to_device(cum, logits.device, "sampling params")
        return self.advance(beam_candidates(logits, cum, self.num_candidates, banned))

    def advance(self, cands: BeamCandidates) -> BeamStep:
        """Apply one step's candidates (best first) and say what the engine must do."""
        new_len = len(self.live[0].token_ids) + 1
        at_max = new_len >= self.max_tokens
        hits = [at_max or t in self.stop_ids for t in cands.token_ids]
        num_finished = self._add_hypotheses(cands, hits, new_len)
        running = [j for j, hit in enumerate(hits) if not hit][: self.width]
        self.done = at_max or not running or self._should_stop(cands.cum_logprobs[running[0]], new_len)
        if self.done:
            step = BeamStep(freed=[b.beam_id for b in self.live], done=True)
            self.live = []
        else:
            step = self._continue(cands, running)
        step.num_finished = num_finished
        return step

    def best(self) -> list[Hypothesis]:
        """The n best hypotheses, best first (live beams fill in if the search was cut short)."""
        pool = list(self.hypotheses)
        for b in self.live:
            pool.append(Hypothesis(list(b.token_ids), b.cum_logprob, self._score(b.cum_logprob, len(b.token_ids)), "length"))
        pool.sort(key=lambda h: h.score, reverse=True)
        return pool[: self.n]

    def _score(self, cum_logprob: float, length: int) -> float:
        return cum_logprob / max(length, 1) ** self.length_penalty

    def _add_hypotheses(self, cands: BeamCandidates, hits: list[bool], new_len: int) -> int:
        """How many finished. Only the top `width` candidates may finish; the rest are spares that keep W beams
        alive."""
        finishing = [j for j in range(min(self.width, len(hits))) if hits[j]]
        for j in finishing:
            token = cands.token_ids[j]
            tokens = self.live[cands.parents[j]].token_ids + [token]
            reason = "stop" if token in self.stop_ids else "length"
            score = self._score(cands.cum_logprobs[j], new_len)
            self.hypotheses.append(Hypothesis(tokens, cands.cum_logprobs[j], score, reason))
        self.hypotheses.sort(key=lambda h: h.score, reverse=True)  # stable: older first on ties
        del self.hypotheses[self.width :]
        return len(finishing)

    def _should_stop(self, best_running: float, new_len: int) -> bool:
        if len(self.hypotheses) < self.width:
            return False
        if self.early_stopping is True:
            return True
        length = new_len
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            length = self.max_tokens  # longer beams only score better: assume the longest
        return self._score(best_running, length) <= self.hypotheses[-1].score

    def _continue(self, cands: BeamCandidates, running: list[int]) -> BeamStep:
        step = BeamStep()
        taken: set[int] = set()
        for j in running:
            parent = self.live[cands.parents[j]]
            if parent.beam_id in taken:
                child_id = self._new_id()
                step.forks.append((parent.beam_id, child_id))
            else:
                child_id = parent.beam_id
                taken.add(child_id)
            step.live.append(Beam(child_id, parent.token_ids + [cands.token_ids[j]], cands.cum_logprobs[j]))
        step.freed = [b.beam_id for b in self.live if b.beam_id not in taken]
        self.live = step.live
        return step
