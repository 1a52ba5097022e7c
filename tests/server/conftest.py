"""Fixtures for the server tests: a server around the fake engine, or the real one when available."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pagedllm.config import EngineConfig
from fake_serving_engine import FakeEngine
from server_harness import RunningServer, start_server


def fake_config(**overrides) -> EngineConfig:
    options = dict(block_size=4, num_blocks=256, max_num_seqs=32, max_model_len=256, max_n=4,
                   served_model_name="fake-model")
    options.update(overrides)
    return EngineConfig(**options)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(FakeEngine(fake_config()))
    yield running
    running.stop()
