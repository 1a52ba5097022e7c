"""Structured outputs: every completion is a sentence of its grammar (a choice, a regex, an EBNF grammar, a JSON
schema, any JSON object), whatever else the batch holds, forks, preemptions and sampling; the rest of the
request's behaviour stays as without one; bad constraints are refused up front."""

import json
import re

import pytest
import torch
from test_engine import make_engine, random_prompts, run_all

from pagedllm import LLM, SamplingParams, StructuredOutputsParams
from pagedllm.engine.grammar import choice_grammar, mask_disallowed
from pagedllm.engine.sampler import SamplingRow, sample
from pagedllm.errors import InvalidInputError

CHOICES = ["alpha", "beta gamma", 'say "hi"\n', "éclair", "back\\slash\b"]
REGEX = r"[a-c]{2,5}-\d{1,3}"
GRAMMAR = 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9] | "x"'
GRAMMAR_RE = r"\((?:[0-9]|x)(?:,(?:[0-9]|x))*\)"


def _texts(outputs) -> list[tuple[str, str]]:
    return [(c.text, c.finish_reason) for o in outputs for c in o.outputs]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_choices_regexes_and_grammars_hold_in_one_mixed_batch(tiny_llama_dir, temperature):
    """Constrained and free requests side by side (prompt steps and decodes mixed): each constrained completion is
    a whole sentence of its own constraint and ends there with "stop"."""
    engine = make_engine(tiny_llama_dir)
    constraints = [StructuredOutputsParams(choice=CHOICES), StructuredOutputsParams(regex=REGEX),
                   StructuredOutputsParams(grammar=GRAMMAR), None] * 3  # fmt: skip
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=40, structured_outputs=c)
              for i, c in enumerate(constraints)]  # fmt: skip
    outputs = run_all(engine, random_prompts(len(params), seed=1), params, check_every_step=True)
    for out, constraint in zip(outputs, constraints):
        text, reason = out.outputs[0].text, out.outputs[0].finish_reason
        if constraint is None:
            continue
        assert reason == "stop", (text, constraint)
        if constraint.choice:
            assert text in CHOICES
        elif constraint.regex:
            assert re.fullmatch(REGEX, text), text
        else:
            assert re.fullmatch(GRAMMAR_RE, text), text


def test_a_constraint_changes_nothing_for_the_requests_beside_it(tiny_llama_dir):
    prompts = random_prompts(4, seed=2)
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = run_all(make_engine(tiny_llama_dir), prompts, free)
    constrained = SamplingParams(temperature=0.0, max_tokens=12, structured_outputs=StructuredOutputsParams(
        regex=REGEX))  # fmt: skip
    mixed = run_all(make_engine(tiny_llama_dir), prompts, [free, constrained, free, constrained])
    for i in (0, 2):
        assert mixed[i].outputs[0].token_ids == alone[i].outputs[0].token_ids


class OnlyEven:
    """A matcher that allows the even tokens."""

    def is_terminated(self):
        return False

    def fill_next_token_bitmask(self, bitmask, row):
        bitmask[row] = 0x55555555  # bits 0, 2, 4, ...


def test_a_grammar_rows_pick_and_logprobs_are_of_the_tokens_it_allows():
    """Greedy takes the likeliest allowed token; logprobs, rank and top-k are of the allowed tokens renormalised,
    as vLLM reports them under structured outputs; a row without a grammar beside it keeps the model's own."""
    logits = torch.randn(2, 70, generator=torch.Generator().manual_seed(0)) * 3
    params = SamplingParams(temperature=0.0, logprobs=3)
    rows = [SamplingRow(params, None, [1], [], grammar=OnlyEven()), SamplingRow(params, None, [1], [])]
    constrained, free = sample(logits.clone(), rows, {2})
    allowed = torch.full_like(logits[0], float("-inf"))
    allowed[::2] = logits[0, ::2]
    expected = torch.log_softmax(allowed, dim=-1)
    assert constrained.token_id == int(allowed.argmax()) and constrained.rank == 1
    assert constrained.logprob == pytest.approx(float(expected.max()), abs=1e-5)
    assert all(t % 2 == 0 and lp == pytest.approx(float(expected[t]), abs=1e-5)
               for t, lp in constrained.top_logprobs.items())
    assert free.token_id == int(logits[1].argmax())
    assert free.logprob == pytest.approx(float(torch.log_softmax(logits[1], -1).max()), abs=1e-5)


def test_logprobs_of_a_constrained_completion_name_only_tokens_its_grammar_allowed(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    params = SamplingParams(temperature=0.0, max_tokens=20, logprobs=5,
                            structured_outputs=StructuredOutputsParams(choice=CHOICES))  # fmt: skip
    [out] = run_all(engine, [[5, 17, 200, 33]], params)
    completion = out.outputs[0]
    assert completion.text in CHOICES
    first = completion.logprobs[0]
    allowed_firsts = {engine.tokenizer.encode(c, add_special_tokens=False)[0] for c in CHOICES}
    finite = {t for t, lp in first.top.items() if lp > float("-inf")}
    assert finite <= allowed_firsts and first.token_id in finite and first.rank == 1


def test_every_sample_of_n_and_every_preempted_request_keeps_to_its_grammar(tiny_llama_dir):
    """n = 4 forks after the prompt (each fork its own matcher), and a pool so small that requests are preempted
    and recomputed mid-sentence."""
    engine = make_engine(tiny_llama_dir, num_blocks=60, max_num_batched_tokens=32)
    params = SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=30,
                            structured_outputs=StructuredOutputsParams(regex="[a-z]{20}"))  # fmt: skip
    outputs = run_all(engine, random_prompts(6, seed=3, low=10, high=20), params, check_every_step=True)
    assert engine.scheduler.num_preemptions > 0
    texts = _texts(outputs)
    assert len(texts) == 24 and len({t for t, _ in texts}) > 4
    for text, reason in texts:
        assert reason == "stop" and re.fullmatch("[a-z]{20}", text), text


def test_ignore_eos_still_ends_where_the_grammar_does(tiny_llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(choice=["done"]))  # fmt: skip
    [out] = run_all(make_engine(tiny_llama_dir), [[5, 6, 7]], params)
    assert (out.outputs[0].text, out.outputs[0].finish_reason) == ("done", "stop")


def test_max_tokens_cuts_a_sentence_short_with_length(tiny_llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=2, structured_outputs=StructuredOutputsParams(
        regex=r"[a-z]{30}"))  # fmt: skip
    [out] = run_all(make_engine(tiny_llama_dir), [[5, 6, 7]], params)
    completion = out.outputs[0]
    assert completion.finish_reason == "length" and re.fullmatch(r"[a-z]+", completion.text)


def test_the_mask_leaves_only_the_allowed_tokens_of_rows_with_a_matcher():
    logits = torch.zeros(3, 70)
    mask_disallowed(logits, [OnlyEven(), None, OnlyEven()])
    for row in (0, 2):
        assert torch.isinf(logits[row, 1::2]).all() and (logits[row, ::2] == 0).all()
    assert (logits[1] == 0).all()


def test_choice_grammar_quotes_each_choice():
    assert choice_grammar(['a"b', "c\\d", "é", "\t\x01"]) == 'root ::= "a\\"b" | "c\\\\d" | "é" | "\\t\\u0001"'


@pytest.mark.parametrize("constraint,answer", [
    ({"choice": ["éclair", "alpha"]}, "éclair"),
    ({"json": {"type": "object", "properties": {"city": {"enum": ["Zürich"]}}, "required": ["city"]}},
     '{"city": "Zürich"}'),
    ({"regex": "Zü[a-z]+"}, "Zürich"),
    ({"grammar": 'root ::= "ok" [0-9]'}, "ok7"),
    ({"json_object": True}, "{}"),
])  # fmt: skip
def test_a_constraint_after_reasoning_lets_the_model_think_first(tiny_llama_dir, constraint, answer):
    """after_reasoning "open": free text up to </think>, whitespace, then the constraint; "optional": either that
    after <think>, or the constraint alone. Non-ASCII literals hold (they went wrong through xgrammar's Grammar
    objects)."""
    from pagedllm.engine.grammar import GrammarCompiler, new_matcher
    from pagedllm.model.tokenizer import load_tokenizer

    compiler = GrammarCompiler(load_tokenizer(tiny_llama_dir), 384, {2})

    def takes(after, text):
        matcher = new_matcher(compiler.compile(StructuredOutputsParams(**constraint, after_reasoning=after)))
        return matcher.accept_string(text) and matcher.is_completed()

    thought = "weigh <it> and </thin é</think>\n\n"
    assert takes("open", thought + answer) and not takes("open", answer) and not takes("open", "<think>" + thought)
    assert takes("optional", "<think>" + thought + answer) and takes("optional", answer)
    assert not takes("optional", thought + answer)
    assert takes(None, answer) and not takes(None, "<think>" + thought + answer)
    with pytest.raises(InvalidInputError, match="after_reasoning must be"):
        StructuredOutputsParams(**constraint, after_reasoning="closed")


@pytest.mark.parametrize("kwargs,message", [
    ({}, "exactly one of json, regex, choice, grammar, json_object; got none"),
    ({"regex": "a", "choice": ["a"]}, "got regex, choice"),
    ({"json": "{not json"}, "structured_outputs.json is not valid JSON"),
    ({"json": [1]}, "must be a JSON schema"),
    ({"choice": []}, "list of 1 to 1024 non-empty strings"),
    ({"choice": ["a", 3]}, "list of 1 to 1024 non-empty strings"),
    ({"regex": ""}, "regex must be a non-empty string"),
    ({"json_object": False}, "json_object must be true"),
])  # fmt: skip
def test_malformed_constraints_are_refused(kwargs, message):
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        StructuredOutputsParams(**kwargs)


def test_a_dict_of_fields_is_taken_and_unknown_ones_refused():
    assert SamplingParams(structured_outputs={"regex": "a+"}).structured_outputs == StructuredOutputsParams(regex="a+")
    with pytest.raises(InvalidInputError, match="does not take: \\['whitespace_pattern'\\]"):
        SamplingParams(structured_outputs={"regex": "a+", "whitespace_pattern": " "})
    with pytest.raises(InvalidInputError, match="does not take: \\['after_reasoning'\\]"):  # the server's to set
        SamplingParams(structured_outputs={"regex": "a+", "after_reasoning": "open"})
    with pytest.raises(InvalidInputError, match="structured_outputs is not supported with use_beam_search"):
        SamplingParams(use_beam_search=True, temperature=0.0, structured_outputs={"regex": "a+"})


@pytest.mark.parametrize("kwargs,message", [
    ({"regex": "a(b"}, "structured_outputs.regex cannot be used"),
    ({"grammar": "root ::= undefined_rule"}, "structured_outputs.grammar cannot be used"),
    ({"json": {"type": "no-such-type"}}, "structured_outputs.json cannot be used"),
])  # fmt: skip
def test_constraints_that_do_not_compile_are_refused_at_add_request(tiny_llama_dir, kwargs, message):
    engine = make_engine(tiny_llama_dir)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        engine.add_request(None, [5, 6], SamplingParams(structured_outputs=StructuredOutputsParams(**kwargs)))
    assert not engine.has_unfinished_requests() and engine.kv.num_used_blocks == 0


SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "population": {"type": "integer"},
                                           "capital": {"type": "boolean"}},
          "required": ["city", "population", "capital"], "additionalProperties": False}  # fmt: skip


@pytest.mark.slow
def test_the_default_model_writes_json_that_its_schema_accepts(default_model_path):
    llm = LLM(model=str(default_model_path), dtype="float32")
    question = [{"role": "user", "content": "Describe Paris as JSON."}]
    for constraint in (StructuredOutputsParams(json=SCHEMA), StructuredOutputsParams(json=json.dumps(SCHEMA)),
                       StructuredOutputsParams(json_object=True)):  # fmt: skip
        outs = llm.chat(question, SamplingParams(n=3, temperature=0.8, seed=1, max_tokens=120,
                                                 structured_outputs=constraint), use_tqdm=False)  # fmt: skip
        for text, reason in _texts(outs):
            assert reason == "stop", text
            value = json.loads(text)
            assert isinstance(value, dict)
            if constraint.json is not None:
                assert list(value) == ["city", "population", "capital"]  # the schema's order
                assert isinstance(value["city"], str) and len(value["city"]) <= 20
                assert type(value["population"]) is int and type(value["capital"]) is bool
