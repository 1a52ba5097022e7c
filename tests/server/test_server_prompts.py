"""PromptProcessor: a text refused piece by piece is really past the context; pieces cover the text."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedllm.entrypoints.server import prompts
from pagedllm.entrypoints.server.errors import APIError

WORDS = st.sampled_from(["block", "table", "the", "PagedAttention", "fox", "0123", "é", "日本", "\n", "  ", ",", "!"])
TEXTS = st.lists(WORDS, min_size=1, max_size=400).map(" ".join)


@pytest.fixture(scope="module")
def tokenizer():
    from tiny import make_tiny_tokenizer

    return make_tiny_tokenizer()


@settings(max_examples=60, deadline=None)
@given(text=TEXTS, size=st.integers(1, 64))
def test_pieces_cover_the_text(text: str, size: int) -> None:
    pieces = list(prompts._pieces(text, size))
    assert "".join(pieces) == text
    assert all(0 < len(p) <= size for p in pieces)


@settings(max_examples=60, deadline=None)
@given(text=TEXTS, context=st.integers(8, 200))
def test_refused_texts_are_past_the_context(tokenizer, monkeypatch_module, text: str, context: int) -> None:
    processor = prompts.PromptProcessor(tokenizer, vocab_size=384, max_model_len=context, workers=1)
    exact = len(tokenizer.encode(text, add_special_tokens=True))
    try:
        ids = asyncio.run(processor.completion_prompts([text]))[0]
    except APIError as exc:
        assert exact >= context, (exact, context, exc.message)
    else:
        assert ids == tokenizer.encode(text, add_special_tokens=True)
    finally:
        processor.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    """Small pieces, so that short texts are counted piece by piece."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prompts, "PIECE_CHARS", 40)
        yield patch


def test_a_text_far_past_the_context_is_refused_early(tokenizer, monkeypatch_module) -> None:
    processor = prompts.PromptProcessor(tokenizer, vocab_size=384, max_model_len=32, workers=1)
    counted: list[str] = []
    monkeypatch_module.setattr(processor, "_count", lambda piece: counted.append(piece) or len(
        tokenizer.encode(piece, add_special_tokens=False)))
    text = "Each sequence owns a block table. " * 500
    with pytest.raises(APIError, match="maximum context length is 32 tokens"):
        asyncio.run(processor.completion_prompts([text]))
    processor.close()
    assert sum(map(len, counted)) < len(text) // 10  # stopped long before the end


def test_pieces_cut_inside_special_tokens_do_not_refuse_a_prompt_that_fits(tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(prompts, "PIECE_CHARS", 400)
    text = "<|im_start|>" * 600  # no whitespace: the pieces are cut through special tokens
    exact = len(tokenizer.encode(text, add_special_tokens=True))
    cuts = len(text) // 400
    assert sum(len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts._pieces(text, 400)) > exact + 4 * cuts
    processor = prompts.PromptProcessor(tokenizer, vocab_size=384, max_model_len=exact + 1, workers=1)
    try:
        assert len(asyncio.run(processor.completion_prompts([text]))[0]) == exact
    finally:
        processor.close()


def test_add_special_tokens_reaches_the_tokenizer() -> None:
    """vLLM's field: a text prompt gets the tokenizer's BOS by default and not with false; a chat prompt (whose
    template writes its own) gets it only with true."""
    from tiny import make_tiny_tokenizer
    from tokenizers import processors

    tokenizer = make_tiny_tokenizer()
    bos = tokenizer.bos_token_id
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                                              special_tokens=[("<s>", bos)])
    processor = prompts.PromptProcessor(tokenizer, vocab_size=384, max_model_len=256, workers=1)
    text = tokenizer.encode("hi", add_special_tokens=False)
    assert asyncio.run(processor.completion_prompts(["hi"]))[0] == [bos, *text]
    assert asyncio.run(processor.completion_prompts(["hi"], add_special_tokens=False))[0] == text
    messages, options = [{"role": "user", "content": "hi"}], {"add_generation_prompt": True}
    chat = asyncio.run(processor.chat_prompt(messages, options))
    assert chat[0] != bos and asyncio.run(processor.chat_prompt(messages, options, add_special_tokens=True)) == [
        bos, *chat]
