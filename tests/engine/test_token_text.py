"""A token's text in the logprobs entries: alone, and where it follows the tokens before it (a character that
spans tokens shows on the token that finishes it)."""

import pytest
from test_detokenizer import TEXTS, balloon, byte_fallback, tokenizer  # noqa: F401  (fixtures)

from pagedllm.engine.token_text import TokenText


def texts_in_context(text_of: TokenText, ids: list[int]) -> list[str]:
    return [text_of.in_context(ids[:i])(token) for i, token in enumerate(ids)]


@pytest.mark.parametrize("text", TEXTS)
def test_texts_in_context_join_into_the_text(tokenizer, text: str) -> None:  # noqa: F811
    ids = tokenizer.encode(text, add_special_tokens=False)
    text_of = TokenText(tokenizer)
    texts = texts_in_context(text_of, ids)
    assert "".join(texts) == tokenizer.decode(ids)
    for token, shown in zip(ids, texts):  # a token that is whole text alone reads the same in context
        if "\ufffd" not in text_of(token):
            assert shown == text_of(token)


def test_a_character_spelled_in_byte_tokens_shows_on_its_last_byte(byte_fallback) -> None:  # noqa: F811
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=byte_fallback)
    ids = [byte_fallback.token_to_id("▁emoji")] + balloon(byte_fallback) + [byte_fallback.token_to_id("▁yes")]
    text_of = TokenText(tokenizer)
    assert [text_of(token) for token in ids[1:5]] == ["\ufffd"] * 4  # alone
    assert texts_in_context(text_of, ids) == [" emoji", "", "", "", "🎈", " yes"]


def test_a_character_never_finished_reads_empty(tokenizer) -> None:  # noqa: F811
    """Its first bytes, with or without tokens before them (the output ended inside the character)."""
    ids = tokenizer.encode(" ok 😀", add_special_tokens=False)
    text_of = TokenText(tokenizer)
    assert text_of(ids[-2]).endswith("\ufffd")
    assert text_of.in_context(ids[:-2])(ids[-2]) == text_of.in_context([])(ids[-2]) == ""
