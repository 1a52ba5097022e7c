"""vLLM's offline beam search API: `LLM.beam_search(prompts, BeamSearchParams(...))`, over the engine's own search.

vLLM (V1) has no `use_beam_search` in its SamplingParams: code written for it asks LLM.beam_search. Here the same
call runs pagedllm's beam search (pagedllm/engine/beam.py, transformers' semantics: a finished beam scores its
cumulative logprob over its output's length, where vLLM divides by the whole sequence's, so beams that end early can
rank differently; docs/server.md) and answers in vLLM's shapes: per prompt a BeamSearchOutput whose sequences, best
first, hold the prompt's and the beam's tokens and their text, as vLLM's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedllm.checks import is_int
from pagedllm.engine.outputs import CompletionOutput, RequestOutput
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams


def beam_temperature(temperature: float) -> float:
    """The engine's temperature for a vLLM beam search asked at `temperature`: the search scores the model's own
    log-probabilities, which 0 and 1 (vLLM's server default for beam search) both ask for; any other value asks for
    something it does not do, so it is refused."""
    if temperature not in (0.0, 1.0):
        raise InvalidInputError(f"temperature must be 0 or 1 (or left out) with beam search: beams are scored by the "
                                f"model's own log-probabilities, got {temperature!r}")
    return 0.0


@dataclass(frozen=True, slots=True)
class BeamSearchParams:
    """vLLM's fields. temperature: 0 or 1, both the same search (beams are scored by the model's own logprobs);
    structured_outputs and watermarking are refused, as the engine's search takes neither."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    structured_outputs: Any = None
    skip_special_tokens: bool = True
    watermarking: bool | None = None

    def sampling_params(self) -> SamplingParams:
        if not is_int(self.beam_width) or self.beam_width < 1:
            raise InvalidInputError(f"beam_width must be an integer >= 1, got {self.beam_width!r}")
        temperature = beam_temperature(self.temperature)
        for name in ("structured_outputs", "watermarking"):
            if getattr(self, name):
                raise InvalidInputError(f"{name} is not supported with beam search")
        return SamplingParams(use_beam_search=True, n=self.beam_width, beam_width=self.beam_width,
                              max_tokens=self.max_tokens, ignore_eos=self.ignore_eos, temperature=temperature,
                              length_penalty=self.length_penalty, skip_special_tokens=self.skip_special_tokens,
                              include_stop_str_in_output=self.include_stop_str_in_output)


@dataclass(slots=True)
class BeamSearchSequence:
    tokens: list[int]  # the prompt's, then the beam's
    cum_logprob: float
    text: str  # of all the tokens, as vLLM decodes them
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[dict] = field(default_factory=list)  # vLLM's per-token dicts: not kept by the engine's search


@dataclass(slots=True)
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first, beam_width of them


def beam_outputs(outputs: list[RequestOutput], tokenizer: Any, skip_special_tokens: bool) -> list[BeamSearchOutput]:
    """Beam search RequestOutputs in vLLM's shapes."""
    return [BeamSearchOutput([_sequence(output.prompt_token_ids, beam, tokenizer, skip_special_tokens)
                              for beam in output.outputs]) for output in outputs]


def _sequence(prompt_ids: list[int], beam: CompletionOutput, tokenizer: Any,
              skip_special_tokens: bool) -> BeamSearchSequence:
    tokens = list(prompt_ids) + list(beam.token_ids)
    return BeamSearchSequence(tokens=tokens, cum_logprob=beam.cumulative_logprob,
                              text=tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens),
                              finish_reason=beam.finish_reason, stop_reason=beam.stop_reason)
