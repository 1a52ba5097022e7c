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
    finally:
        server.stop()
