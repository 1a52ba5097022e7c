"""Sampling and text output edges a mutation run showed unguarded: each test fails when the line it names is
changed (the sampler's logit bias, min-p, top-p ties and inverse CDF; the detokenizer's stop tokens, stop-string
ties and sliding window; beam candidates and stop reasons; logprobs and cumulative logprobs in outputs)."""

import math

import pytest
import torch
from test_engine import GREEDY, make_engine, run_all

import pagedllm.engine.sampler as sampler
from pagedllm.engine.beam import BeamSearch
from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.engine.outputs import TokenLogprob
from pagedllm.engine.sampler import SamplingRow, make_generator, sample
from pagedllm.sampling_params import SamplingParams

PROMPT = [5, 6, 7, 8]


def greedy_pick(logits: list[float], **params) -> int:
    row = SamplingRow(SamplingParams(temperature=0.0, **params), None, [], [])
    return sample(torch.tensor([logits]), [row], set())[0].token_id


def test_logit_bias_adds_to_the_logit():
    """index_put_ accumulates: a bias of 3 on a logit of 3 beats 5; a bias of 4 on 0 does not."""
    assert greedy_pick([0.0, 5.0, 3.0], logit_bias={2: 3.0}) == 2
    assert greedy_pick([0.0, 5.0, 3.0], logit_bias={0: 4.0}) == 1


def draws(logits: list[list[float]], torch_path: bool, monkeypatch, **params) -> set[int]:
    if torch_path:  # as on a GPU: no compiled CPU kernels
        monkeypatch.setattr(sampler, "load_cpu_kernels", lambda: None)
    rows = [SamplingRow(SamplingParams(seed=i, **params), make_generator(i), [], []) for i in range(200)]
    x = torch.tensor(logits).expand(len(rows), -1).contiguous()
    return {r.token_id for r in sample(x, rows, set())}


@pytest.mark.parametrize("torch_path", [False, True], ids=["kernels", "torch"])
def test_min_p_one_and_a_top_p_tie_keep_one_token(torch_path, monkeypatch):
    logits = [[1.0, 3.0, 2.0, 0.5]]
    assert draws(logits, torch_path, monkeypatch, temperature=1.0, min_p=1.0) == {1}
    assert draws(logits, torch_path, monkeypatch, temperature=1.0, min_p=1.0, top_k=3) == {1}
    # p = .5 / .5 and top_p = .5: the first token's mass already reaches it, so only it stays (as in vLLM)
    assert draws([[0.0, 0.0]], torch_path, monkeypatch, temperature=1.0, top_p=0.5) == {0}


def test_inverse_cdf_at_zero_skips_tokens_of_no_probability():
    token = sampler._inverse_cdf(torch.tensor([[0.0, 0.0, 0.5, 0.5]]), torch.tensor([0.0], dtype=torch.float64))
    assert token.tolist() == [2]


class Pieces:
    """Token id i decodes to pieces[i]; records the widest decode call."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces, self.widest = pieces, 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.widest = max(self.widest, len(ids))
        return "".join(self.pieces[i] for i in ids)


def stream(tokenizer, ids: list[int], params: SamplingParams, prompt=(), stop_ids=frozenset()) -> tuple:
    detok = IncrementalDetokenizer(tokenizer, params, list(prompt), stop_ids)
    deltas = [detok.append(t) for t in ids] + [detok.finish()]
    return detok, "".join(deltas)


def test_a_stop_tokens_text_is_kept_only_with_include_stop_str_in_output():
    shown = SamplingParams(stop_token_ids=[1], include_stop_str_in_output=True)
    assert stream(Pieces(["Hi", "!"]), [0, 1], shown, stop_ids={1})[1] == "Hi!"
    assert stream(Pieces(["Hi", "!"]), [0, 1], SamplingParams(stop_token_ids=[1]), stop_ids={1})[1] == "Hi"


@pytest.mark.parametrize("stop,text,reason", [(["bc", "abc"], "xa", "bc"), (["abc", "bc"], "x", "abc")])
def test_stop_strings_that_complete_together_go_by_their_order(stop, text, reason):
    detok, _ = stream(Pieces(["xabc"]), [0], SamplingParams(stop=stop))
    assert (detok.text, detok.stop_reason) == (text, reason)


def test_the_decode_window_slides():
    """Each decode call sees a few ids, not the whole output: the cost stays linear in the output's length."""
    tokenizer = Pieces(["a", "b", " "] + ["p"] * 5)
    detok, _ = stream(tokenizer, [0, 1, 2] * 200, SamplingParams(), prompt=[3] * 5)
    assert detok.text == "ab " * 200 and tokenizer.widest <= 16


def test_beam_candidates_reach_past_every_stop_token():
    """With stop ids {1, 2} a beam of width 1 draws 3 candidates (transformers' max(2, 1 + stops) x width), so the
    search goes on when its two likeliest tokens both end it."""
    params = SamplingParams(use_beam_search=True, n=1, temperature=0.0, early_stopping="never", max_tokens=5)
    step = BeamSearch(params, {1, 2}, max_tokens=5).step(torch.tensor([[0.0, 5.0, 4.9, 4.8, -10.0]]))
    assert not step.done and [b.token_ids for b in step.live] == [[3]]


def test_outputs_carry_their_alternatives_sums_and_held_back_text(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    kinds = [SamplingParams(max_tokens=6, logprobs=3, **GREEDY),
             SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=6, logprobs=3, ignore_eos=True)]
    for out in run_all(engine, [PROMPT] * 2, kinds):
        for c in out.outputs:
            assert all(len(entry.top) == 3 for entry in c.logprobs)
            total = sum(entry.logprob for entry in c.logprobs)
            assert c.cumulative_logprob < 0 and math.isclose(c.cumulative_logprob, total, abs_tol=1e-5)
    (plain,) = run_all(engine, [PROMPT], SamplingParams(max_tokens=6, **GREEDY))
    text = plain.outputs[0].text
    never = SamplingParams(max_tokens=6, stop=[text[-1] + "\x00never"], **GREEDY)  # holds back the last character
    (held,) = run_all(engine, [PROMPT], never)
    assert (held.outputs[0].text, held.outputs[0].finish_reason) == (text, "length")
    beams = SamplingParams(use_beam_search=True, n=2, temperature=0.0, max_tokens=3, ignore_eos=True)
    (beam,) = run_all(engine, [PROMPT], beams)
    assert all((o.finish_reason, o.stop_reason) == ("length", None) for o in beam.outputs)


@pytest.mark.parametrize("entry", [TokenLogprob(5, -0.1, {5: -0.1, 7: -2.0}),  # the token among its top-k
                                   TokenLogprob(9, -3.0, {5: -0.1, 7: -2.0})])  # the token outside it
def test_a_token_logprob_holds_each_token_once(entry):
    keys = list(entry)
    assert len(keys) == len(set(keys)) == len(entry) == len(dict(entry))
    assert keys[0] == entry.token_id


def test_n_2_gives_two_completions(tiny_llama_dir):
    (out,) = run_all(make_engine(tiny_llama_dir), [PROMPT],
                     SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=3, ignore_eos=True))
    assert [c.index for c in out.outputs] == [0, 1] and all(len(c.token_ids) == 3 for c in out.outputs)


def test_an_eos_stop_reports_no_stop_reason_and_a_stop_token_its_id(tiny_llama_dir):
    """As vLLM: stop_reason is None when the tokenizer's EOS ended the output, the id when a stop token did."""
    engine = make_engine(tiny_llama_dir)
    eos = engine.tokenizer.eos_token_id
    (out,) = run_all(engine, [PROMPT], SamplingParams(temperature=0.0, logit_bias={eos: 100}, max_tokens=4))
    assert (out.outputs[0].token_ids, out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ([eos], "stop", None)
    (out,) = run_all(engine, [PROMPT], SamplingParams(temperature=0.0, logit_bias={9: 100}, stop_token_ids=[9]))
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", 9)


def test_unseeded_completions_draw_from_streams_of_their_own(tiny_llama_dir):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=8, ignore_eos=True)
    a, b = run_all(make_engine(tiny_llama_dir), [PROMPT] * 2, params)
    completions = [tuple(c.token_ids) for out in (a, b) for c in out.outputs]
    assert len(set(completions)) == len(completions)


def test_a_finished_beam_searchs_outputs_are_all_new(tiny_llama_dir):
    params = SamplingParams(use_beam_search=True, n=2, temperature=0.0, max_tokens=3, ignore_eos=True)
    (out,) = run_all(make_engine(tiny_llama_dir), [PROMPT], params)
    assert all(o.new_token_ids == o.token_ids and o.new_text == o.text for o in out.outputs)


def test_an_earlier_outputs_prompt_logprobs_stay_as_they_were(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=4)  # the prompt in chunks of 4 across steps
    engine.add_request("r", list(range(5, 25)), SamplingParams(max_tokens=1, prompt_logprobs=1, **GREEDY))
    seen = []
    while engine.has_unfinished_requests():
        seen += [(out.prompt_logprobs, len(out.prompt_logprobs)) for out in engine.step()]
    assert len(seen) > 1 and all(len(entries) == n for entries, n in seen)


def test_a_stop_string_ends_the_completion_there(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    (plain,) = run_all(engine, [PROMPT], SamplingParams(max_tokens=12, **GREEDY))
    ids, text = plain.outputs[0].token_ids, plain.outputs[0].text
    head = engine.tokenizer.decode(ids[:3])  # a character of the first tokens' text ends the output early
    stop = next(c for c in reversed(head) if not c.isspace() and c != "\ufffd")
    (out,) = run_all(engine, [PROMPT], SamplingParams(max_tokens=12, stop=[stop], **GREEDY))
    c = out.outputs[0]
    assert (c.finish_reason, c.stop_reason, c.text) == ("stop", stop, text[: text.index(stop)])
    assert len(c.token_ids) <= 3
