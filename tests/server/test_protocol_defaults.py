"""A request's sampling fields over the model's defaults (generation_config.json), as vLLM takes them."""

from pagedllm.entrypoints.protocol import ChatCompletionRequest, CompletionRequest

DEFAULTS = {"temperature": 0.6, "top_p": 0.9, "max_tokens": 3}
MESSAGES = [{"role": "user", "content": "hi"}]


def test_fields_left_out_take_the_models_defaults() -> None:
    chat = ChatCompletionRequest(messages=MESSAGES).to_sampling_params(DEFAULTS)
    assert (chat.temperature, chat.top_p, chat.max_tokens) == (0.6, 0.9, 3)
    completion = CompletionRequest(prompt="x").to_sampling_params(DEFAULTS)
    assert (completion.temperature, completion.top_p, completion.max_tokens) == (0.6, 0.9, 16)  # OpenAI's 16


def test_a_requests_own_values_win() -> None:
    chat = ChatCompletionRequest(messages=MESSAGES, temperature=0.0, max_completion_tokens=7).to_sampling_params(
        DEFAULTS)
    assert (chat.temperature, chat.top_p, chat.max_tokens) == (0.0, 0.9, 7)
    assert ChatCompletionRequest(messages=MESSAGES).to_sampling_params().temperature == 1.0  # no model defaults


def test_a_models_default_max_tokens_is_shortened_to_the_context_not_refused(tmp_path, tiny_llama_dir) -> None:
    """A chat leaving max_tokens out, on a model whose max_new_tokens passes the context: the engine shortens it,
    as when there is no default; only a value the client sent is refused."""
    import json
    import shutil

    import httpx

    from pagedllm.config import EngineConfig
    from pagedllm.engine.llm_engine import LLMEngine
    from server_harness import start_server

    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    generation = json.loads((tmp_path / "m" / "generation_config.json").read_text())
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps(generation | {"max_new_tokens": 1000}))
    engine = LLMEngine(EngineConfig(model=str(tmp_path / "m"), dtype="float32", num_blocks=64, block_size=4,
                                    max_model_len=64))
    server = start_server(engine)
    try:
        url = server.base_url + "/v1/chat/completions"
        body = {"messages": MESSAGES, "temperature": 0, "ignore_eos": True}
        answer = httpx.post(url, json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 64  # up to the context
        assert httpx.post(url, json=body | {"max_tokens": 1000}, timeout=60).status_code == 400
    finally:
        server.stop()


def test_prompt_logprobs_are_asked_for_only_with_echo() -> None:
    """Nothing shows a prompt's logprobs but the echo: without it they would cost a softmax per prompt token."""
    assert CompletionRequest(prompt="x", logprobs=2).to_sampling_params().prompt_logprobs is None
    assert CompletionRequest(prompt="x", logprobs=2, echo=True).to_sampling_params().prompt_logprobs == 2


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    """As OpenAI and vLLM: max_tokens is the deprecated name."""
    chat = ChatCompletionRequest(messages=MESSAGES, max_tokens=5, max_completion_tokens=2)
    assert chat.to_sampling_params().max_tokens == 2


def test_reasoning_effort_reaches_the_template() -> None:
    from pagedllm.entrypoints.protocol import TokenizeRequest

    for cls in (ChatCompletionRequest, TokenizeRequest):
        body = cls.model_validate({"messages": MESSAGES, "reasoning_effort": "low", "chat_template_kwargs": {"a": 1}})
        assert body.template_options()["template_kwargs"] == {"a": 1, "reasoning_effort": "low"}


def test_a_request_may_hold_the_most_prompts() -> None:
    from pagedllm.entrypoints.protocol import MAX_PROMPTS

    assert len(CompletionRequest(prompt=["x"] * MAX_PROMPTS).prompts()) == MAX_PROMPTS


def test_a_message_reaches_the_template_with_only_the_fields_it_has() -> None:
    """A template that tests `"name" in message` must not see the fields left out, as None."""
    (message,) = ChatCompletionRequest(messages=MESSAGES).template_messages()
    assert message == {"role": "user", "content": "hi"}


def test_bad_words_reach_the_sampling_params() -> None:
    words = ["two words", "one"]
    assert CompletionRequest(prompt="x", bad_words=words).to_sampling_params().bad_words == words
    assert ChatCompletionRequest(messages=MESSAGES, bad_words=words).to_sampling_params().bad_words == words
    assert CompletionRequest(prompt="x").to_sampling_params().bad_words is None
