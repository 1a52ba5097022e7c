"""Every field of vLLM 0.32's request models (listed here from `vllm.entrypoints.openai.*.protocol` and
`vllm.entrypoints.serve.tokenize.protocol`) is one that this
server's body declares (and takes, or refuses past its default) or one it refuses by name (NOT_TAKEN): none is
dropped as unknown, which a client of vLLM would not notice."""

import pytest

from pagedllm.entrypoints.protocol import NOT_TAKEN, ChatCompletionRequest, CompletionRequest, TokenizeRequest
from pagedllm.entrypoints.responses_protocol import ResponsesRequest

VLLM_COMPLETION = [
    "add_special_tokens", "allowed_token_ids", "bad_words", "cache_salt", "ec_transfer_params", "echo",
    "frequency_penalty", "ignore_eos", "include_stop_str_in_output", "kv_transfer_params", "length_penalty",
    "logit_bias", "logprob_token_ids", "logprobs", "max_tokens", "min_p", "min_tokens", "mm_payload", "model", "n",
    "presence_penalty", "priority", "prompt", "prompt_embeds", "prompt_logprobs", "repetition_detection",
    "repetition_penalty", "request_id", "response_format", "return_mm_kwargs", "return_token_ids",
    "return_token_offsets", "return_tokens_as_token_ids", "routed_experts_prompt_start", "seed", "session_id",
    "skip_special_tokens", "spaces_between_special_tokens", "stop", "stop_token_ids", "stream", "stream_interval",
    "stream_options", "structured_outputs", "suffix", "temperature", "thinking_token_budget", "top_k", "top_p",
    "truncate_prompt_tokens", "truncation_side", "use_beam_search", "user", "vllm_xargs", "watermarking",
]
VLLM_CHAT = [
    "add_generation_prompt", "add_special_tokens", "allowed_token_ids", "bad_words", "cache_salt", "chat_template",
    "chat_template_kwargs", "continue_final_message", "documents", "ec_transfer_params", "echo",
    "frequency_penalty", "ignore_eos", "include_reasoning", "include_stop_str_in_output", "kv_transfer_params",
    "length_penalty", "logit_bias", "logprob_token_ids", "logprobs", "max_completion_tokens", "max_tokens",
    "media_io_kwargs", "messages", "min_p", "min_tokens", "mm_payload", "mm_processor_kwargs", "model", "n",
    "parallel_tool_calls", "presence_penalty", "priority", "prompt_logprobs", "reasoning_effort",
    "repetition_detection", "repetition_penalty", "request_id", "response_format", "return_mm_kwargs",
    "return_prompt_text", "return_token_ids", "return_token_offsets", "return_tokens_as_token_ids",
    "routed_experts_prompt_start", "seed", "session_id", "skip_special_tokens", "spaces_between_special_tokens",
    "stop", "stop_token_ids", "stream", "stream_interval", "stream_options", "structured_outputs", "temperature",
    "thinking_token_budget", "tool_choice", "tools", "top_k", "top_logprobs", "top_p", "truncate_prompt_tokens",
    "truncation_side", "use_beam_search", "user", "vllm_xargs", "watermarking",
]
VLLM_RESPONSES = [
    "background", "cache_salt", "chat_template_kwargs", "ec_transfer_params", "enable_response_messages",
    "frequency_penalty", "ignore_eos", "include", "include_reasoning", "include_stop_str_in_output", "input",
    "instructions", "kv_transfer_params", "logit_bias", "max_output_tokens", "max_tool_calls", "media_io_kwargs",
    "metadata", "min_p", "mm_payload", "mm_processor_kwargs", "model", "parallel_tool_calls", "presence_penalty",
    "previous_input_messages", "previous_response_id", "priority", "prompt", "prompt_cache_key", "reasoning",
    "repetition_penalty", "request_id", "return_mm_kwargs", "seed", "service_tier", "session_id",
    "skip_special_tokens", "stop", "stop_token_ids", "store", "stream", "structured_outputs", "temperature", "text",
    "tool_choice", "tools", "top_k", "top_logprobs", "top_p", "truncation", "user", "vllm_xargs", "watermarking",
]


VLLM_TOKENIZE = [  # its chat and completion forms in one body here
    "add_generation_prompt", "add_special_tokens", "chat_template", "chat_template_kwargs", "continue_final_message",
    "media_io_kwargs", "messages", "mm_processor_kwargs", "model", "prompt", "return_token_strs", "tools",
]


@pytest.mark.parametrize("body,vllm_fields", [(CompletionRequest, VLLM_COMPLETION), (ChatCompletionRequest, VLLM_CHAT),
                                              (ResponsesRequest, VLLM_RESPONSES), (TokenizeRequest, VLLM_TOKENIZE)],
                         ids=["completions", "chat", "responses", "tokenize"])
def test_every_vllm_field_is_taken_or_refused_by_name(body, vllm_fields: list[str]) -> None:
    unaccounted = sorted(set(vllm_fields) - set(body.model_fields) - set(NOT_TAKEN))
    assert unaccounted == []
    assert body.model_config["extra"] == "allow"  # so that refuse_not_taken sees the refused ones
