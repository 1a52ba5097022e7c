"""The real openai client (sync and async) against the server: completions and chat, streamed or not."""

from __future__ import annotations

import asyncio

import openai
import pytest

from server_harness import RunningServer

CHAT = [{"role": "user", "content": "Say something."}]


def sync_client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def async_client(server: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_lists_the_served_model(server: RunningServer) -> None:
    models = sync_client(server).models.list()
    assert [m.id for m in models.data] == [server.model]


def test_completion_greedy_text_and_usage(server: RunningServer) -> None:
    r = sync_client(server).completions.create(model=server.model, prompt="Hello", max_tokens=8, temperature=0)
    choice = r.choices[0]
    assert r.object == "text_completion" and choice.index == 0
    assert choice.finish_reason in ("length", "stop")
    assert choice.text
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 8


def test_completion_stream_matches_non_stream(server: RunningServer) -> None:
    client = sync_client(server)
    full = client.completions.create(model=server.model, prompt="Once upon", max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=server.model, prompt="Once upon", max_tokens=12,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_completion_token_ids_and_list_of_prompts(server: RunningServer) -> None:
    client = sync_client(server)
    r = client.completions.create(model=server.model, prompt=["first", "second"], n=2, max_tokens=4)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    ids = client.completions.create(model=server.model, prompt=[72, 105], max_tokens=3, echo=True)
    assert ids.choices[0].text.startswith(server.async_engine.tokenizer.decode([72, 105]))


def test_completion_logprobs(server: RunningServer) -> None:
    r = sync_client(server).completions.create(model=server.model, prompt="Hi", max_tokens=5, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(x <= 0 for x in lp.token_logprobs)
    # The two alternatives and the sampled token where it is not one of them (OpenAI's legacy shape).
    assert all(len(top) <= 3 and token in top for token, top in zip(lp.tokens, lp.top_logprobs))
    assert lp.text_offset == sorted(lp.text_offset)


def test_completion_echo_with_logprobs_covers_the_prompt_first(server: RunningServer) -> None:
    client = sync_client(server)
    prompt = [72, 105, 33, 40]
    full = client.completions.create(model=server.model, prompt=prompt, max_tokens=3, echo=True, logprobs=1,
                                     temperature=0)
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == len(prompt) + full.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing comes before the first token
    assert all(x <= 0 for x in lp.token_logprobs[1:]) and all(lp.tokens[i] in lp.top_logprobs[i] for i in range(1, 7))
    assert lp.text_offset[: len(prompt)] == sorted(lp.text_offset[: len(prompt)]) and lp.text_offset[0] == 0
    chunks = list(client.completions.create(model=server.model, prompt=prompt, max_tokens=3, echo=True, logprobs=1,
                                            temperature=0, stream=True))
    echoed = chunks[0].choices[0].logprobs  # the prompt's chunk carries the prompt's logprobs
    assert echoed.tokens == lp.tokens[: len(prompt)] and echoed.token_logprobs == lp.token_logprobs[: len(prompt)]
    # one running count over prompt and completion, streamed or not
    assert lp.text_offset == sorted(lp.text_offset)
    streamed = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert streamed == lp.text_offset


def test_echo_with_max_tokens_zero_scores_the_prompt_alone(server: RunningServer) -> None:
    """How evaluation harnesses score a text: the prompt and its logprobs, nothing generated (as vLLM answers)."""
    client = sync_client(server)
    prompt = [72, 105, 33, 40]
    scored = client.completions.create(model=server.model, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert scored.usage.completion_tokens == 0 and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(prompt) and choice.logprobs.token_logprobs[0] is None
    full = client.completions.create(model=server.model, prompt=prompt, max_tokens=2, echo=True, logprobs=1)
    assert choice.text and full.choices[0].text.startswith(choice.text)  # the echoed prompt, no completion
    assert choice.logprobs.token_logprobs == full.choices[0].logprobs.token_logprobs[: len(prompt)]
    chunks = list(client.completions.create(model=server.model, prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_logit_bias_forces_a_token(server: RunningServer) -> None:
    client = sync_client(server)
    forced = 72  # a token id of both engines' tokenizers
    r = client.completions.create(model=server.model, prompt="Hi", max_tokens=3, logit_bias={str(forced): 100},
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == server.async_engine.tokenizer.decode([forced] * 3)
    chat = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=2, logit_bias={"72": 100},
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == server.async_engine.tokenizer.decode([forced] * 2)


def test_allowed_token_ids_bound_the_tokens(server: RunningServer) -> None:
    client = sync_client(server)
    r = client.completions.create(model=server.model, prompt="Hi", max_tokens=3,
                                  extra_body={"ignore_eos": True, "allowed_token_ids": [72]})
    assert r.choices[0].text == server.async_engine.tokenizer.decode([72] * 3)


def test_completion_stop_string_ends_text(server: RunningServer) -> None:
    client = sync_client(server)
    free = client.completions.create(model=server.model, prompt="Go", max_tokens=20, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = free[5:8]
    assert len(stop) == 3, "the unconstrained text is too short to pick a stop string from"
    for stream in (False, True):
        kwargs = dict(model=server.model, prompt="Go", max_tokens=20, temperature=0, stop=[stop],
                      extra_body={"ignore_eos": True})
        if stream:
            chunks = list(client.completions.create(stream=True, **kwargs))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = chunks[-1].choices[0].finish_reason
        else:
            choice = client.completions.create(**kwargs).choices[0]
            text, reason = choice.text, choice.finish_reason
        assert text == free[:free.index(stop)] and reason == "stop"


def test_chat_completion_and_stream_agree(server: RunningServer) -> None:
    client = sync_client(server)
    r = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=10, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=10,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def test_continuous_usage_stats_give_every_chunk_its_usage_so_far(server: RunningServer) -> None:
    client = sync_client(server)
    prompts = [[72, 105, 33], [72, 105, 33, 40, 41]]
    whole = client.completions.create(model=server.model, prompt=prompts, n=2, max_tokens=6, temperature=0)
    chunks = list(client.completions.create(model=server.model, prompt=prompts, n=2, max_tokens=6, temperature=0,
                                            stream=True, stream_options=CONTINUOUS))
    so_far: dict[int, int] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        assert chunk.usage.prompt_tokens == len(prompts[choice.index // 2])
        assert chunk.usage.completion_tokens >= so_far.get(choice.index, 0)
        so_far[choice.index] = chunk.usage.completion_tokens
    assert sorted(so_far) == [0, 1, 2, 3]
    assert sum(so_far.values()) == whole.usage.completion_tokens == chunks[-1].usage.completion_tokens
    chat = list(client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=5, temperature=0,
                                               stream=True, stream_options=CONTINUOUS))
    assert chat[0].usage.completion_tokens == 0 and chat[0].usage.prompt_tokens == chat[-1].usage.prompt_tokens
    assert chat[-2].usage.completion_tokens == chat[-1].usage.completion_tokens > 0


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(server: RunningServer) -> None:
    """...or its first ones with vLLM's truncation_side "right"."""
    client = sync_client(server)
    prompt = list(range(70, 90))
    cut = client.completions.create(model=server.model, prompt=prompt, max_tokens=3, temperature=0,
                                    extra_body={"truncate_prompt_tokens": 4})
    tail = client.completions.create(model=server.model, prompt=prompt[-4:], max_tokens=3, temperature=0)
    assert cut.usage.prompt_tokens == 4 and cut.choices[0].text == tail.choices[0].text
    whole = client.completions.create(model=server.model, prompt=prompt, max_tokens=1,
                                      extra_body={"truncate_prompt_tokens": -1})  # -1: up to max_model_len
    assert whole.usage.prompt_tokens == len(prompt)
    chat = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=1,
                                          extra_body={"truncate_prompt_tokens": 3})
    assert chat.usage.prompt_tokens == 3
    right = client.completions.create(model=server.model, prompt=prompt, max_tokens=3, temperature=0,
                                      extra_body={"truncate_prompt_tokens": 4, "truncation_side": "right"})
    head = client.completions.create(model=server.model, prompt=prompt[:4], max_tokens=3, temperature=0)
    assert right.usage.prompt_tokens == 4 and right.choices[0].text == head.choices[0].text


def test_chat_n_and_logprobs(server: RunningServer) -> None:
    r = sync_client(server).chat.completions.create(
        model=server.model, messages=CHAT, max_tokens=6, n=3, logprobs=True, top_logprobs=2, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    for choice in r.choices:
        entries = choice.logprobs.content
        assert entries and all(e.logprob <= 0 and len(e.top_logprobs) <= 2 for e in entries)
        # a token that reads whole: its text's bytes (one splitting a character reads "\ufffd", its own bytes)
        assert all(e.bytes == list(e.token.encode()) for e in entries if "\ufffd" not in e.token)
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)


def test_chat_template_options_reach_the_template(server: RunningServer) -> None:
    client, template = sync_client(server), server.async_engine.tokenizer
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I"}]
    for options in ({"add_generation_prompt": False},
                    {"add_generation_prompt": False, "continue_final_message": True}):
        r = client.chat.completions.create(model=server.model, messages=turns, max_tokens=1, extra_body=options)
        text = template.apply_chat_template(turns, tokenize=False, **options)
        assert r.usage.prompt_tokens == len(template.encode(text, add_special_tokens=False))


def test_chat_max_completion_tokens(server: RunningServer) -> None:
    r = sync_client(server).chat.completions.create(model=server.model, messages=CHAT,
                                                    max_completion_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_async_client_streams_concurrently(server: RunningServer) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str]:
        stream = await client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=8,
                                                      temperature=0, stream=True, n=2)
        texts = {0: "", 1: ""}
        async for chunk in stream:
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
        return texts[0], texts[1]

    async def main() -> list[tuple[str, str]]:
        async with async_client(server) as client:
            single = await client.completions.create(model=server.model, prompt="x", max_tokens=2,
                                                     extra_body={"ignore_eos": True})
            assert single.usage.completion_tokens == 2  # (its text may be empty: a random model's sampled tokens)
            return await asyncio.gather(*(one(client, i) for i in range(6)))

    results = asyncio.run(asyncio.wait_for(main(), 60))
    assert all(a and b for a, b in results)
    assert len({r[0] for r in results}) == 1  # greedy: every request the same


def test_unknown_model_is_not_found(server: RunningServer) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sync_client(server).completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"
