"""The two OpenAI logprobs shapes built from the engine's TokenLogprob entries."""

from pagedllm.engine.outputs import TokenLogprob
from pagedllm.engine.token_text import TokenText
from pagedllm.entrypoints.server.logprobs import (TokenIdText, chat_logprobs, completion_logprobs, prompt_logprobs,
                                                   vllm_prompt_logprobs)


class LetterTokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return self.decode([token_id])


def test_completion_top_logprobs_add_the_sampled_token_when_it_is_not_among_them() -> None:
    entries = [
        TokenLogprob(token_id=2, logprob=-3.0, top={0: -0.5, 1: -1.0}),  # sampled outside the top 2
        TokenLogprob(token_id=0, logprob=-0.5, top={0: -0.5, 1: -1.0}),  # sampled inside
        TokenLogprob(token_id=3, logprob=float("-inf"), top={}),  # logprobs=0
    ]
    out = completion_logprobs(entries, TokenText(LetterTokenizer()), offset=4)
    assert out["tokens"] == ["c", "a", "d"]
    assert out["token_logprobs"] == [-3.0, -0.5, -9999.0]
    assert out["top_logprobs"] == [{"a": -0.5, "b": -1.0, "c": -3.0}, {"a": -0.5, "b": -1.0}, {"d": -9999.0}]
    assert out["text_offset"] == [4, 5, 6]


def test_alternatives_that_read_the_same_keep_the_likeliest() -> None:
    class Replacement(LetterTokenizer):
        def decode(self, ids: list[int]) -> str:
            return "\ufffd" if ids[0] >= 10 else "x"

    entries = [TokenLogprob(token_id=0, logprob=-5.0, top={10: -1.0, 11: -1.5, 0: -5.0})]
    assert completion_logprobs(entries, TokenText(Replacement()), 0)["top_logprobs"] == [{"\ufffd": -1.0, "x": -5.0}]


def test_the_echoed_prompts_part_has_no_logprob_for_its_first_token() -> None:
    prompt = prompt_logprobs([0, 1, 2], [None, TokenLogprob(1, -1.0, {}), TokenLogprob(2, -2.0, {})],
                             TokenText(LetterTokenizer()))
    assert prompt == {"tokens": ["a", "b", "c"], "token_logprobs": [None, -1.0, -2.0],
                      "top_logprobs": [None, {"b": -1.0}, {"c": -2.0}], "text_offset": [0, 1, 2]}


def test_chat_top_logprobs_are_exactly_the_alternatives() -> None:
    entries = [TokenLogprob(token_id=2, logprob=-3.0, top={0: -0.5})]
    (item,) = chat_logprobs(entries, TokenText(LetterTokenizer()))["content"]
    assert item["token"] == "c" and item["logprob"] == -3.0 and item["bytes"] == [99]
    assert item["top_logprobs"] == [{"token": "a", "logprob": -0.5, "bytes": [97]}]


def test_chat_bytes_join_into_characters_split_across_tokens() -> None:
    """OpenAI's `bytes` are the token's own: a byte-level token holding half a character reads '�', but its
    bytes are the real ones, so that a client can join them (they were the bytes of '�')."""
    from tiny import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    text = "naïve 日本 😀!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    entries = [TokenLogprob(token_id=i, logprob=-1.0, top={}) for i in ids]
    content = chat_logprobs(entries, TokenText(tokenizer))["content"]
    assert any(item["token"] == "\ufffd" for item in content)  # some token splits a character
    assert bytes(b for item in content for b in item["bytes"]).decode("utf-8") == text


def test_a_sentencepiece_byte_tokens_bytes_are_its_byte() -> None:
    class ByteTokens:
        def decode(self, ids: list[int]) -> str:
            return "\ufffd"

        def convert_ids_to_tokens(self, token_id: int) -> str:
            return f"<0x{token_id:02X}>"

    (item,) = chat_logprobs([TokenLogprob(token_id=0xF0, logprob=-1.0, top={})], TokenText(ByteTokens()))["content"]
    assert item["bytes"] == [0xF0]


def test_a_sentencepiece_tokens_text_keeps_its_leading_space():
    """decode([id]) strips the space a "▁" piece stands for at a text's start; inside a text it is there."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁": 1, "▁quick": 2, "▁▁x": 3, "fox": 4}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Strip(" ", 1, 0)])
    text_of = TokenText(PreTrainedTokenizerFast(tokenizer_object=backend))
    assert [text_of(t) for t in (1, 2, 3, 4)] == [" ", " quick", "  x", "fox"]


def test_vllm_prompt_logprobs_give_the_token_first_then_its_alternatives_by_rank() -> None:
    entries = [None, TokenLogprob(2, -3.0, {0: -0.5, 1: -1.0}, rank=7), TokenLogprob(0, -0.5, {0: -0.5}, rank=1)]
    assert vllm_prompt_logprobs(entries, TokenText(LetterTokenizer())) == [
        None,
        {"2": {"logprob": -3.0, "rank": 7, "decoded_token": "c"},
         "0": {"logprob": -0.5, "rank": 1, "decoded_token": "a"},
         "1": {"logprob": -1.0, "rank": 2, "decoded_token": "b"}},
        {"0": {"logprob": -0.5, "rank": 1, "decoded_token": "a"}},
    ]


def test_tokens_named_by_id_keep_their_own_bytes_and_count_offsets_by_name() -> None:
    names = TokenIdText(TokenText(LetterTokenizer()))
    entries = [TokenLogprob(token_id=2, logprob=-3.0, top={0: -0.5}), TokenLogprob(token_id=11, logprob=-1.0, top={})]
    out = completion_logprobs(entries, names, offset=0)
    assert out["tokens"] == ["token_id:2", "token_id:11"] and out["text_offset"] == [0, 10]
    assert out["top_logprobs"][0] == {"token_id:0": -0.5, "token_id:2": -3.0}
    (item, _) = chat_logprobs(entries, names)["content"]
    assert (item["token"], item["bytes"]) == ("token_id:2", [99])
    assert item["top_logprobs"] == [{"token": "token_id:0", "logprob": -0.5, "bytes": [97]}]
