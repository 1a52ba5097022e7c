"""Past --max-waiting-requests waiting requests the server answers 503 with Retry-After."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from conftest import fake_config
from fake_serving_engine import FakeEngine
from server_harness import RunningServer, start_server

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.entrypoints.protocol import CompletionRequest
from pagedllm.entrypoints.server.errors import APIError
from pagedllm.entrypoints.server.submission import submit
from pagedllm.sampling_params import SamplingParams


def hold_stream(server: RunningServer, stop: threading.Event) -> None:
    body = {"prompt": "hold", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as response:
        for _ in response.iter_lines():
            if stop.is_set():
                return


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_overload_answers_503_with_retry_after() -> None:
    engine = FakeEngine(fake_config(max_num_seqs=1), step_delay=0.01)
    server = start_server(engine, max_waiting_requests=2)
    stop = threading.Event()
    holders = [threading.Thread(target=hold_stream, args=(server, stop), daemon=True) for _ in range(3)]
    try:
        for count, holder in enumerate(holders):  # one runs, then two wait
            holder.start()
            assert wait_for(lambda: server.stats().num_running + server.stats().num_waiting == count + 1)
        assert (server.stats().num_running, server.stats().num_waiting) == (1, 2)
        response = httpx.post(server.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "server_overloaded"
        stop.set()
        for holder in holders:
            holder.join(15)
        stats = server.wait_idle()
        assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)
        ok = httpx.post(server.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        assert ok.status_code == 200
    finally:
        stop.set()
        server.stop()


def test_a_submission_is_refused_when_the_server_filled_up_while_it_was_tokenized() -> None:
    """The capacity is checked again at submission: others may have been admitted in the meantime."""
    engine = AsyncEngine(FakeEngine(fake_config()), max_waiting_requests=1)
    engine.is_overloaded = lambda: True  # filled up after the handler's first check
    with pytest.raises(APIError) as info:
        asyncio.run(submit(engine, "cmpl", [[1, 2, 3]], SamplingParams(max_tokens=2), CompletionRequest(prompt=[1, 2, 3]),
                           {}))
    assert info.value.status == 503
