"""Fixtures for the server tests: a live server around the fake engine and, when it works, the real one.

The real LLMEngine runs on the tiny random Llama from tests/conftest.py. A quick probe (a 2-token
request must finish within a bounded number of steps) decides whether it can serve; if not, the
real-engine variants skip with the probe's finding and the fake engine alone covers the server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from fake_serving_engine import FakeEngine
from pagedllm.config import EngineConfig
from server_harness import RunningServer, start_server

_probe_result: dict[str, str | None] = {}


def fake_config(**overrides: Any) -> EngineConfig:
    options = dict(block_size=4, num_blocks=256, max_num_seqs=32, max_model_len=256, max_n=4,
                   served_model_name="fake-model")
    options.update(overrides)
    return EngineConfig(**options)


def real_config(model_dir: Any) -> EngineConfig:
    return EngineConfig(model=str(model_dir), block_size=4, num_blocks=512, max_num_seqs=32,
                        max_num_batched_tokens=256, max_model_len=256, max_n=4, served_model_name="tiny-llama")


def probe_real_engine(model_dir: Any) -> str | None:
    """None if the real engine serves a 2-token request in bounded steps, else why not."""
    if "real" in _probe_result:
        return _probe_result["real"]
    try:
        from pagedllm.engine.llm_engine import LLMEngine
        from pagedllm.sampling_params import SamplingParams

        engine = LLMEngine(real_config(model_dir))
        engine.add_request("probe", "Hello there", SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        deadline = time.monotonic() + 20
        finished = False
        for _ in range(50):
            finished = any(o.finished for o in engine.step()) or finished
            if finished or time.monotonic() > deadline:
                break
        reason = None if finished else "the real LLMEngine did not finish a 2-token request within 50 steps"
    except Exception as exc:  # an engine still being written: say why, run the fake variants
        reason = f"the real LLMEngine cannot serve yet: {type(exc).__name__}: {exc}"
    _probe_result["real"] = reason
    return reason


def make_engine(kind: str, request: pytest.FixtureRequest) -> Any:
    if kind == "fake":
        return FakeEngine(fake_config())
    model_dir = request.getfixturevalue("tiny_llama_dir")
    reason = probe_real_engine(model_dir)
    if reason is not None:
        pytest.skip(reason)
    from pagedllm.engine.llm_engine import LLMEngine

    return LLMEngine(real_config(model_dir))


@pytest.fixture(scope="module", params=["fake", "real"])
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    running = start_server(make_engine(request.param, request))
    yield running
    running.stop()
