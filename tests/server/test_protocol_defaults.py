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
