"""The output stage: from one step's logits to what happened (sampled tokens, forks, stops, beam choices).

Pure with respect to the engine: it reads the step and the sequences and returns a StepOutcome; the
scheduler applies it. It owns what sampling needs: the stop ids, the engine's random stream for
unseeded requests, and a new Completion for each sequence that a fork will create.
"""

from dataclasses import dataclass

import torch

from pagedllm.engine.beam import BeamSearch, BeamStep
from pagedllm.engine.completion import Completion
from pagedllm.engine.detokenizer import IncrementalDetokenizer, Tokenizer, direct_decoder
from pagedllm.engine.grammar import accept, new_matcher
from pagedllm.engine.outcome import BeamChoice, SampledToken, StepOutcome
from pagedllm.engine.request import Request, Sequence
from pagedllm.engine.sampler import SampleResult, SamplingRow, make_generator, sample
from pagedllm.engine.step_logits import StepLogits, greedy_only
from pagedllm.engine.step import SchedulerOutput
from pagedllm.engine.thinking_budget import ThinkingBudget, ThinkTags
from pagedllm.repetition_detection import REPETITION, REPETITION_DETECTED, ends_in_repetition


@dataclass(frozen=True, slots=True)
class _Target:
    """One token to sample: for `seq` of `request` into `completion`, from logits row `row`; `fork`: into a
    new sequence forked from `seq` (a fresh n > 1 request's other samples)."""

    request: Request
    seq: Sequence
    completion: Completion
    row: int
    fork: bool


class OutputStage:
    def __init__(
        self, tokenizer: Tokenizer, eos_token_ids: set[int], seed: int, device: torch.device | str = "cpu",
        think_tags: ThinkTags | None = None,
    ) -> None:
        self.think_tags = think_tags  # the reasoning tags a thinking_token_budget goes by (None: none can)
        self.tokenizer = direct_decoder(tokenizer)
        self.eos_token_ids = eos_token_ids
        self.tokenizer_eos = tokenizer.eos_token_id  # the end token reported as no stop_reason
        self.device = torch.device(device)  # where the logits are: each completion's generator lives there
        self._rng = torch.Generator().manual_seed(seed)

    def start(self, request: Request) -> Completion | None:
        """Output state of a new request's first sequence (beam search: the search itself, no completion)."""
        if request.params.use_beam_search:
            max_tokens = request.max_total_len - len(request.prompt_token_ids)
            request.beam = BeamSearch(request.params, self.eos_token_ids, max_tokens, root_id=0)
            return None
        return self.new_completion(request, 0)

    def new_completion(self, request: Request, index: int) -> Completion:
        params = request.params
        stop_ids = frozenset(params.stop_ids(self.eos_token_ids))
        detokenizer = IncrementalDetokenizer(self.tokenizer, params, request.prompt_token_ids, stop_ids)
        logprobs = [] if params.num_logprobs is not None else None
        grammar = None if request.grammar is None else new_matcher(request.grammar)
        return Completion(index, detokenizer, self._generator(request, index), logprobs, grammar,
                          self._thinking(request))

    def _thinking(self, request: Request) -> ThinkingBudget | None:
        """A budgeted request's place in its reasoning (LLMEngine checked that the tags are known)."""
        budget = request.params.thinking_token_budget
        return None if budget is None else ThinkingBudget(self.think_tags, budget, request.prompt_token_ids)

    def _generator(self, request: Request, index: int) -> torch.Generator:
        """Completion `index`'s own random stream: from the request's seed, else from the engine's seed."""
        if request.params.seed is not None:
            return make_generator(request.params.seed, index, self.device)
        seed = int(torch.randint(0, 2**62, (1,), generator=self._rng))
        return torch.Generator(self.device).manual_seed(seed)

    def process(self, step: SchedulerOutput, logits: StepLogits) -> StepOutcome:
        """logits: one row per sequence of step.logits_seqs(), in that order."""
        outcome = StepOutcome()
        targets: list[_Target] = []
        for request, items in _rows_by_request(step).items():
            outcome.sampled.append(request)
            if request.params.use_beam_search:
                outcome.beams.append(BeamChoice(request, _beam_step(request, items, logits)))
            else:
                targets.extend(self._targets(request, items))
        if targets:
            for target, result in zip(targets, self._sample(targets, logits)):
                outcome.tokens.append(self._token(target, result))
        return outcome

    def greedy_rows(self, step: SchedulerOutput) -> list[bool]:
        """Per logits row of the step: whether its sampling needs only the greedy pick (see StepLogits)."""
        return [
            not s.request.params.use_beam_search
            and greedy_only(_sampling_row(s.request, s.seq, s.seq.completion))
            for s in step.logits_seqs()
        ]

    def _sample(self, targets: list[_Target], logits: StepLogits) -> list[SampleResult]:
        """Rows that arrive as their greedy pick keep it; the others are sampled from their full logits."""
        results: list[SampleResult | None] = [logits.greedy.get(t.row) for t in targets]
        todo = [targets[i] for i, result in enumerate(results) if result is None]
        if todo:
            rows = [_sampling_row(t.request, t.seq, t.completion) for t in todo]
            picked = logits.rows([t.row for t in todo])
            fresh = iter(sample(picked, rows, self.eos_token_ids))
            results = [result if result is not None else next(fresh) for result in results]
        return results

    def _targets(self, request: Request, items: list[tuple[Sequence, int]]) -> list[_Target]:
        """The tokens to sample for a request's sequences. A fresh n > 1 request's prompt was prefilled once:
        n - 1 new sequences fork it and sample from the same row."""
        targets = [_Target(request, seq, seq.completion, row, False) for seq, row in items]
        if request.is_fresh and request.params.n > 1:
            parent, row = items[0]
            targets += [_Target(request, parent, self.new_completion(request, i), row, True)
                        for i in range(1, request.params.n)]  # fmt: skip
        return targets

    def _token(self, t: _Target, result: SampleResult) -> SampledToken:
        reason, stop = self._token_stop(t.request, t.seq, result.token_id)
        grammar = t.completion.grammar
        if grammar is not None and accept(grammar, result.token_id) and reason is None:
            reason, stop = "stop", t.request.params.stop_reason(result.token_id, self.tokenizer_eos)
        return SampledToken(t.request, t.seq, t.completion, result.token_id, result.logprob, result.top_logprobs,
                            t.fork, reason, stop, result.rank)

    def _token_stop(self, request: Request, seq: Sequence, token: int) -> tuple[str | None, int | None]:
        """Why `token` ends the sequence, judged on token ids (stop strings are the detokenizer's)."""
        params = request.params
        num_out = len(seq.token_ids) + 1 - seq.num_prompt_tokens
        if num_out >= params.min_tokens and token in params.stop_ids(self.eos_token_ids):
            return "stop", params.stop_reason(token, self.tokenizer_eos)
        if len(seq.token_ids) + 1 >= request.max_total_len:
            return "length", None
        detect = params.repetition_detection
        if detect is not None and num_out >= params.min_tokens and ends_in_repetition(seq.output_ids + [token], detect):
            return REPETITION, REPETITION_DETECTED
        return None, None


def _sampling_row(request: Request, seq: Sequence, completion: Completion) -> SamplingRow:
    thinking = completion.thinking
    forced = None if thinking is None else thinking.forced_token(seq.output_ids)
    return SamplingRow(request.params, completion.generator, request.prompt_token_ids, seq.output_ids,
                       request.bad_word_spellings, completion.grammar, forced)


def _beam_step(request: Request, items: list[tuple[Sequence, int]], logits: StepLogits) -> BeamStep:
    """Every live beam computed its last token this step; the search picks the next beams."""
    search: BeamSearch = request.beam
    row_of = {seq.index: row for seq, row in items}
    return search.step(logits.rows([row_of[b.beam_id] for b in search.live]))


def _rows_by_request(step: SchedulerOutput) -> dict[Request, list[tuple[Sequence, int]]]:
    groups: dict[Request, list[tuple[Sequence, int]]] = {}
    for row, s in enumerate(step.logits_seqs()):
        groups.setdefault(s.request, []).append((s.seq, row))
    return groups
