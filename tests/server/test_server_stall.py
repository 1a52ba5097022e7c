"""A maximal request (a body at --max-request-bytes) is refused without stalling a running stream.

While the big request is being refused the stream must keep coming: tokens arrive inside each
refusal at no less than a sixth of the stream's own median pace, and no gap between tokens there
is longer than a multiple of the median gap. The server runs as a child process (`pagedllm serve`),
so the test's own clients, which build and send the 4 MiB bodies, share only the machine's cores with
it, not its interpreter lock, heap or leftover threads of earlier tests. On two cores, with the
server working as intended, a refusal ran at a third to a half of the median pace with gaps of 5-9
median gaps; with the body tokenized in one go, 52-89 median gaps; a refusal that held the stream
(parsing or tokenizing the body on the event loop) lets at most a token through while it lasts.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from spawned_server import start_logged

from pagedllm.bench.soak import LEFT_BEHIND, scrape
from pagedllm.entrypoints.server import DEFAULT_MAX_REQUEST_BYTES

CONTEXT = 4096
GAP_FACTOR = 20  # the longest gap may be this many median gaps
MIN_PACE = 1 / 6  # tokens inside a refusal, as a share of the stream's median pace


@dataclass
class SpawnedServer:
    base_url: str

    def wait_idle(self, timeout: float = 10.0) -> tuple[float, ...]:
        """(blocks used, running, waiting) once all are 0, or as last seen at timeout."""
        deadline = time.monotonic() + timeout
        while True:
            metrics = scrape(httpx.get(self.base_url + "/metrics", timeout=10).text)
            left = tuple(metrics[name] for name in LEFT_BEHIND)
            if not any(left) or time.monotonic() > deadline:
                return left
            time.sleep(0.05)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpawnedServer]:
    from tiny import save_tiny_dir

    # Wider and deeper than the usual tiny model, so a step takes long enough that the machine's
    # own scheduling noise stays a small multiple of the median gap.
    model_dir = save_tiny_dir(tmp_path_factory.mktemp("tiny_long"), max_position_embeddings=CONTEXT,
                              hidden_size=512, intermediate_size=2048, num_hidden_layers=6,
                              num_attention_heads=8, num_key_value_heads=4)
    args = [sys.executable, "-m", "pagedllm", "serve", "--model", str(model_dir), "--port", "0",
            "--block-size", "16", "--num-blocks", "600", "--max-num-seqs", "4", "--max-num-batched-tokens",
            "256", "--max-model-len", str(CONTEXT), "--served-model-name", "tiny-long"]
    # One OpenMP thread: on a machine with more runnable threads than cores (the test's clients,
    # the server's loop and workers), OpenMP's parallel regions stall on a descheduled thread and
    # the step time jumps whatever the server does; this test is about the server.
    proc, port, log = start_logged(args, ready_timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        yield SpawnedServer(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert "Traceback" not in "".join(log), "".join(log)


def maximal_body(field: str) -> bytes:
    """A body of exactly the default cap: a prompt (or one chat message) of a repeated sentence."""
    text_field = "prompt" if field == "prompt" else "content"
    template = {"prompt": "", "max_tokens": 4} if field == "prompt" else \
        {"messages": [{"role": "user", "content": ""}], "max_tokens": 4}
    head = json.dumps(template).encode()
    filler = (b"Each sequence owns a block table. " * (DEFAULT_MAX_REQUEST_BYTES // 30))
    at = head.index(f'"{text_field}": ""'.encode()) + len(text_field) + 5
    body = head[:at] + filler[:DEFAULT_MAX_REQUEST_BYTES - len(head)] + head[at:]
    assert len(body) == DEFAULT_MAX_REQUEST_BYTES
    return body


class StreamClock:
    """Reads one long stream in a thread and stamps each chunk's arrival."""

    def __init__(self, server: SpawnedServer) -> None:
        self.server, self.stamps, self.stop = server, [], threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        body = {"prompt": "hello", "max_tokens": CONTEXT - 16, "ignore_eos": True, "temperature": 0,
                "stream": True}
        with httpx.stream("POST", self.server.base_url + "/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    self.stamps.append(time.perf_counter())
                if self.stop.is_set():
                    return  # leaving closes the connection: the server aborts the request

    def wait_for(self, count: int) -> None:
        while len(self.stamps) < count and self.thread.is_alive():
            time.sleep(0.005)
        assert len(self.stamps) >= count, "the stream ended early"


def refuse(server: SpawnedServer, path: str, body: bytes) -> tuple[float, float]:
    start = time.perf_counter()
    response = httpx.post(server.base_url + path, content=body, timeout=120)
    end = time.perf_counter()
    assert response.status_code == 400, response.text[:300]
    assert "maximum context length" in response.json()["error"]["message"]
    return start, end


def test_maximal_requests_do_not_stall_a_stream(server: SpawnedServer) -> None:
    clock = StreamClock(server)
    clock.thread.start()
    clock.wait_for(30)
    windows = [refuse(server, "/v1/completions", maximal_body("prompt")),
               refuse(server, "/v1/chat/completions", maximal_body("messages"))]
    clock.wait_for(len(clock.stamps) + 30)
    clock.stop.set()
    clock.thread.join(60)
    stamps = list(clock.stamps)
    gaps = [(a, b - a) for a, b in zip(stamps, stamps[1:])]
    median = statistics.median(g for _, g in gaps)
    during = [g for a, g in gaps for start, end in windows if a < end and a + g > start]
    assert during, "no token gap overlapped the refused requests"
    assert max(during) < GAP_FACTOR * median, (max(during), median, [e - s for s, e in windows])
    for start, end in windows:
        inside = sum(start < stamp < end for stamp in stamps)
        assert inside >= MIN_PACE * (end - start) / median, (inside, end - start, median)
    assert server.wait_idle() == (0, 0, 0)
