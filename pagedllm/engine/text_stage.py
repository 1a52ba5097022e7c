"""The detokenizer stage: turns a step's sampled tokens into text deltas and logprobs, ends sequences on
stop strings, and decodes the hypotheses of finished beam searches. Writes only Completions and the
outcome; the scheduler applies the stops."""

from pagedllm.engine.beam import BeamSearch
from pagedllm.engine.detokenizer import Tokenizer, decode_after
from pagedllm.engine.outcome import BeamChoice, SampledToken, StepOutcome
from pagedllm.engine.outputs import CompletionOutput, TokenLogprob
from pagedllm.engine.token_text import TokenText


def detokenize(outcome: StepOutcome, tokenizer: Tokenizer, text_of: TokenText | None = None) -> None:
    """text_of: the tokens' texts, for the logprobs entries to show (Logprob.decoded_token)."""
    for token in outcome.tokens:
        _add_token(token, text_of)
    for choice in outcome.beams:
        if choice.step.done:
            choice.request.final_outputs = _beam_outputs(choice, tokenizer)


def _add_token(token: SampledToken, text_of: TokenText | None) -> None:
    completion = token.completion
    completion.cumulative_logprob += token.logprob
    shows_text = token.request.params.detokenize
    if completion.logprobs is not None:
        # the sequence does not hold the token yet (with a fork: the parent it copies)
        texts = text_of.in_context(token.seq.token_ids) if text_of is not None and shows_text else None
        completion.logprobs.append(TokenLogprob(token.token_id, token.logprob, token.top_logprobs or {}, token.rank,
                                                texts))
    if shows_text:
        _add_text(token)


def _add_text(token: SampledToken) -> None:
    completion = token.completion
    detokenizer = completion.detokenizer
    completion.add_text(detokenizer.append(token.token_id))
    if token.finish_reason is not None or detokenizer.stop_reason is not None:
        completion.add_text(detokenizer.finish())  # what was held back, where a stop string may still show
    if detokenizer.stop_reason is not None:  # a stop string ends it whatever the token-level verdict
        token.finish_reason, token.stop_reason = "stop", detokenizer.stop_reason


def _beam_outputs(choice: BeamChoice, tokenizer: Tokenizer) -> list[CompletionOutput]:
    search: BeamSearch = choice.request.beam
    params = choice.request.params
    outputs = []
    for i, hypothesis in enumerate(search.best()):
        ids = list(hypothesis.token_ids)
        stopped = hypothesis.finish_reason == "stop"
        # as a sampled sequence ends: the stop token's text only with include_stop_str_in_output
        shown = ids[:-1] if stopped and not params.include_stop_str_in_output else ids
        text = decode_after(tokenizer, choice.request.prompt_token_ids, shown, params.skip_special_tokens) \
            if params.detokenize else ""
        stop_reason = params.stop_reason(ids[-1], getattr(tokenizer, "eos_token_id", None)) if stopped else None
        outputs.append(CompletionOutput(
            index=i, text=text, token_ids=ids, logprobs=None, finish_reason=hypothesis.finish_reason,
            cumulative_logprob=hypothesis.cum_logprob, new_text=text, new_token_ids=list(ids),
            stop_reason=stop_reason,
        ))
    return outputs
