"""The two OpenAI logprobs shapes built from the engine's TokenLogprob entries."""

from pagedllm.engine.outputs import TokenLogprob
from pagedllm.entrypoints.server.logprobs import TokenText, chat_logprobs, completion_logprobs


class LetterTokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


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


def test_chat_top_logprobs_are_exactly_the_alternatives() -> None:
    entries = [TokenLogprob(token_id=2, logprob=-3.0, top={0: -0.5})]
    (item,) = chat_logprobs(entries, TokenText(LetterTokenizer()))["content"]
    assert item["token"] == "c" and item["logprob"] == -3.0 and item["bytes"] == [99]
    assert item["top_logprobs"] == [{"token": "a", "logprob": -0.5, "bytes": [97]}]
