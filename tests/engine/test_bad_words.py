"""bad_words: the spellings banned for each word, the tokens they ban after an output, and the engine's picks
against transformers' logits with those tokens masked."""

import pytest
import torch
from test_engine import GREEDY, hf_model, make_engine, random_prompts, run_all  # noqa: F401  (hf_model: fixture)

from pagedllm.engine.bad_words import ban_bad_words, bad_word_spellings, banned_tokens
from pagedllm.engine.sampler import SamplingRow, make_generator, sample
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import MAX_BAD_WORDS, SamplingParams


class WordTokenizer:
    """Encodes whole known texts to fixed ids, as a test double for a subword tokenizer."""

    def __init__(self, table: dict[str, list[int]]) -> None:
        self.table = table

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        return self.table.get(text, [])


def test_a_words_spelling_after_a_space_is_banned_where_it_is_other_tokens_of_the_same_number():
    tok = WordTokenizer({
        "cat": [10], " cat": [11],  # a word-start token: both banned
        "dog": [20, 21], " dog": [22],  # fewer tokens after a space: only the plain spelling
        "emu": [30], " emu": [1, 30],  # the space is a token of its own: only the plain spelling
        "owl": [40], " owl": [40],  # the same token: once
    })
    assert bad_word_spellings(tok, ["cat", "dog", "emu", "owl"], 100) == [[10], [11], [20, 21], [30], [40]]
    assert bad_word_spellings(tok, ["  cat"], 100) == [[10], [11]]  # leading spaces do not count


def test_bad_word_spellings_that_cannot_be_banned_are_refused():
    tok = WordTokenizer({"cat": [10], " cat": [11], "big": [500]})
    with pytest.raises(InvalidInputError, match="must tokenize to at least one token, got 'zzz'"):
        bad_word_spellings(tok, ["cat", "zzz"], 100)
    with pytest.raises(InvalidInputError, match="past the model's vocabulary of 100: \\[500\\]"):
        bad_word_spellings(tok, ["big"], 100)
    many = WordTokenizer({f"{p}w{i}": [i if p == "" else 1000 + i] for i in range(64) for p in ("", " ")})
    many.table["solo"] = [900]  # one spelling only
    assert len(bad_word_spellings(many, [f"w{i}" for i in range(64)], 2000)) == MAX_BAD_WORDS
    with pytest.raises(InvalidInputError, match="give 129 token sequences, at most 128"):
        bad_word_spellings(many, [f"w{i}" for i in range(64)] + ["solo"], 2000)


def test_a_spellings_last_token_is_banned_only_right_after_the_rest_of_it():
    spellings = [[7], [3, 4], [1, 2, 5]]
    assert banned_tokens(spellings, []) == [7]  # a one-token spelling: always
    assert banned_tokens(spellings, [9, 3]) == [7, 4]
    assert banned_tokens(spellings, [3, 9]) == [7]
    assert banned_tokens(spellings, [2]) == [7]  # [1, 2] is not there whole
    assert banned_tokens(spellings, [8, 1, 2]) == [7, 5]


def test_ban_bad_words_masks_each_rows_own_tokens_in_place():
    logits = torch.zeros(3, 10)
    out = ban_bad_words(logits, [[[4]], [], [[1, 2], [6]]], [[], [4], [0, 1]])
    assert out is logits
    assert torch.isinf(logits).nonzero().tolist() == [[0, 4], [2, 2], [2, 6]]


def test_the_sampler_never_picks_a_banned_token_and_reports_the_models_own_logprob():
    logits = torch.zeros(2, 16)
    logits[:, 5] = 50.0  # by far the likeliest token
    raw = torch.log_softmax(logits, -1)
    for _ in range(20):
        rows = [SamplingRow(SamplingParams(temperature=0), None, [], [], [[5]]),
                SamplingRow(SamplingParams(temperature=1.0), make_generator(None), [], [9], [[9, 5]])]
        results = sample(logits.clone(), rows, set())
        assert all(r.token_id != 5 for r in results)
        assert [r.logprob for r in results] == pytest.approx([float(raw[i, r.token_id]) for i, r in enumerate(results)])
    plain = [SamplingRow(SamplingParams(temperature=0), None, [], [8], [[9, 5]])]  # the prefix is not there
    assert sample(logits.clone(), plain, set())[0].token_id == 5


@pytest.mark.parametrize("words,message", [
    ("cat", "must be a list of strings"), ([""], "must contain words"), ([" \n"], "must contain words"),
    ([3], "must contain words"), ([f"w{i}" for i in range(MAX_BAD_WORDS + 1)], "may hold at most 128 words"),
])  # fmt: skip
def test_bad_words_that_are_not_words_are_refused(words, message):
    with pytest.raises(InvalidInputError, match=f"bad_words {message}"):
        SamplingParams(bad_words=words)


def test_bad_words_are_kept_once_each_in_order():
    assert SamplingParams(bad_words=("b", "a", "b")).bad_words == ["b", "a"]


def test_beam_search_refuses_bad_words():
    with pytest.raises(InvalidInputError, match="bad_words is not supported with use_beam_search"):
        SamplingParams(use_beam_search=True, temperature=0.0, bad_words=["a"])


def hf_greedy_without(hf_model, prompt: list[int], spellings: list[list[int]], max_new: int) -> list[int]:
    """transformers' greedy tokens with each step's banned tokens masked, recomputed over the whole text."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new):
            logits = hf_model(torch.tensor([prompt + out])).logits[0, -1]
            for s in spellings:
                if len(s) == 1 or out[len(out) - len(s) + 1 :] == s[:-1]:
                    logits[s[-1]] = float("-inf")
            out.append(int(logits.argmax()))
    return out


def test_the_engines_picks_are_transformers_greedy_with_the_bad_words_masked(tiny_llama_dir, hf_model):
    engine = make_engine(tiny_llama_dir)
    prompt = random_prompts(1, seed=11, low=12, high=12)[0]
    (free,) = run_all(engine, [prompt], SamplingParams(max_tokens=10, **GREEDY))
    free_ids = free.outputs[0].token_ids
    # two words the model writes unasked: the text of its second output token and of its 5th and 6th together
    words = [engine.tokenizer.decode(free_ids[1:2]), engine.tokenizer.decode(free_ids[4:6])]
    spellings = bad_word_spellings(engine.tokenizer, words, 384)
    assert any(len(s) > 1 for s in spellings)
    (banned,) = run_all(engine, [prompt], SamplingParams(max_tokens=10, bad_words=words, logprobs=0, **GREEDY))
    ids = banned.outputs[0].token_ids
    assert ids != free_ids
    assert ids == hf_greedy_without(hf_model, prompt, spellings, 10)
    assert all(t not in banned_tokens(spellings, ids[:i]) for i, t in enumerate(ids))
    with torch.no_grad():  # the model's own logprobs, as with logit_bias
        want = torch.log_softmax(hf_model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1], -1)
    assert [e.logprob for e in banned.outputs[0].logprobs] == pytest.approx(
        [float(want[i, t]) for i, t in enumerate(ids)], abs=1e-4)


def test_allowed_tokens_that_are_all_bad_words_are_refused(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    encode = engine.tokenizer.encode
    word = next(w for w in ("the", "a", "is") if len(encode(w, add_special_tokens=False)) == 1)
    params = SamplingParams(allowed_token_ids=encode(word, add_special_tokens=False), bad_words=[word])
    with pytest.raises(InvalidInputError, match="allowed_token_ids are all bad_words"):
        engine.add_request("r", [5, 6, 7], params)
    assert engine.requests == {} and engine.kv.num_used_blocks == 0
