"""The built-in default model behind the server answers a simple question sensibly."""

from __future__ import annotations

import openai
import pytest

from pagedllm.config import EngineConfig
from server_harness import start_server


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_default_model_knows_the_capital_of_france(default_model_path) -> None:
    from pagedllm.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(default_model_path), num_blocks=256, max_model_len=1024))
    server = start_server(engine)
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model=server.model, temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in reply.choices[0].message.content, reply.choices[0].message.content
        streamed = client.chat.completions.create(
            model=server.model, temperature=0, max_tokens=24, stream=True,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == reply.choices[0].message.content
        # Greek: byte tokens that each hold half a character, so the tokens' texts outnumber the text's characters
        greek = dict(model=server.model, prompt="Ελληνικά: Η γλώσσα", max_tokens=12, temperature=0, logprobs=0)
        whole = client.completions.create(**greek).choices[0].logprobs
        assert "\ufffd" in "".join(whole.tokens)
        chunks = client.completions.create(**greek, stream=True)
        streamed_offsets = [o for c in chunks if c.choices and c.choices[0].logprobs
                            for o in c.choices[0].logprobs.text_offset]
        assert streamed_offsets == whole.text_offset  # counted by the tokens' texts, streamed or not
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_default_model_calls_a_named_tool_and_the_required_ones(default_model_path) -> None:
    """The weather question: a named call gives arguments its schema accepts, and so does "required"."""
    import json

    from pagedllm.engine.llm_engine import LLMEngine

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}  # fmt: skip
    engine = LLMEngine(EngineConfig(model=str(default_model_path), num_blocks=256, max_model_len=1024))
    server = start_server(engine)
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        ask = dict(model=server.model, temperature=0, max_tokens=60, tools=[weather],
                   messages=[{"role": "user", "content": "What is the weather like in Paris today?"}])
        named = client.chat.completions.create(**ask, tool_choice={"type": "function",
                                                                  "function": {"name": "get_weather"}})
        [call] = named.choices[0].message.tool_calls
        assert named.choices[0].finish_reason == "stop" and json.loads(call.function.arguments) == {
            "city": "Paris", "unit": "celsius"}
        # one call: where more may follow, this small model in bfloat16 on an AMX CPU (greedy) adds valid calls to
        # the array until max_tokens, never closing it; float32 and the AVX-512 EPYC's bfloat16 stop after one
        required = client.chat.completions.create(**ask, tool_choice="required",
                                                  parallel_tool_calls=False).choices[0]
        assert required.finish_reason == "tool_calls" and required.message.tool_calls[0].function.name == "get_weather"
        assert json.loads(required.message.tool_calls[0].function.arguments)["city"] == "Paris"
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dashboard_shows_the_real_pool_while_requests_run(default_model_path, tmp_path) -> None:
    """The live page in headless Chromium, with the real engine and model behind it."""
    import re
    import subprocess
    import time

    from pagedllm.engine.llm_engine import LLMEngine
    from test_server_dashboard import chromium_args, ensure_chromium, keep_busy

    chromium = ensure_chromium()
    engine = LLMEngine(EngineConfig(model=str(default_model_path), num_blocks=128, max_model_len=1024))
    server = start_server(engine, shutdown_timeout=0.2)
    try:
        keep_busy(server, 6)  # 150 tokens each, n = 1 or 2: many seconds of decoding on the real model
        deadline = time.monotonic() + 60
        while server.stats().blocks_used == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        args = chromium_args(chromium, tmp_path / "profile") + ["--dump-dom", server.base_url + "/dashboard"]
        dom = subprocess.run(args, capture_output=True, text=True, timeout=120).stdout
        assert dom.count('data-id="') == 128
        assert 'data-state="used"' in dom
        running = re.search(r'id="running">(\d+)<', dom)
        assert running and int(running.group(1)) > 0
    finally:
        server.stop()
