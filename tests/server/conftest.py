"""Fixtures for the server tests: a live server around the fake engine and around the real one.

The real LLMEngine runs on the tiny random Llama from tests/conftest.py; the fake engine (same
contract) makes timing-dependent cases (slow streams, overload) deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fake_serving_engine import FakeEngine
from pagedllm.config import EngineConfig
from server_harness import RunningServer, start_server

def fake_config(**overrides: Any) -> EngineConfig:
    options = dict(block_size=4, num_blocks=256, max_num_seqs=32, max_model_len=256, max_n=4,
                   served_model_name="fake-model")
    options.update(overrides)
    return EngineConfig(**options)


def real_config(model_dir: Any) -> EngineConfig:
    return EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_blocks=512, max_num_seqs=32,
                        max_num_batched_tokens=256, max_model_len=256, max_n=4, served_model_name="tiny-llama")


def make_engine(kind: str, request: pytest.FixtureRequest) -> Any:
    if kind == "fake":
        return FakeEngine(fake_config())
    model_dir = request.getfixturevalue("tiny_llama_dir")
    from pagedllm.engine.llm_engine import LLMEngine

    return LLMEngine(real_config(model_dir))


@pytest.fixture(scope="module", params=["fake", "real"])
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    running = start_server(make_engine(request.param, request))
    yield running
    running.stop()
