"""`pagedllm serve --tensor-parallel-size 2`: a worker killed mid-stream fails the stream with the reason,
the server reports unhealthy and exits 1; SIGTERM stops every rank. No process is left (checked by PID)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from spawned_server import start_logged, stream_in_background
from tp_helpers import alive



def start(model: Path) -> tuple[subprocess.Popen, int, list[int], list[str]]:
    args = [sys.executable, "-m", "pagedllm", "serve", "--model", str(model), "--tensor-parallel-size", "2",
            "--dtype", "float32", "--num-blocks", "128", "--block-size", "4", "--port", "0",
            "--shutdown-timeout", "0.5"]  # fmt: skip
    proc, port, log = start_logged(args, ready_timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    pids = re.search(r"worker pids ([\d ]+)", "".join(log))
    assert pids, "".join(log)
    return proc, port, [int(p) for p in pids.group(1).split()], log


def _gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(p) for p in pids)


def test_a_worker_killed_mid_stream_fails_the_stream_and_the_server_exits_1(tiny_llama_dir) -> None:
    proc, port, workers, log = start(tiny_llama_dir)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        client, seen = stream_in_background(port, read_timeout=60, started_within=30)
        os.kill(workers[0], signal.SIGKILL)
        client.join(30)
        assert not client.is_alive()
        error = [line for line in seen if "tensor-parallel rank failed" in line]
        assert error and f"pid {workers[0]}" in error[0], seen[-3:]
        assert proc.wait(timeout=30) == 1
        assert any("server stopped: the engine failed" in line for line in log)
        assert _gone(workers)
    finally:
        proc.kill()


def test_sigterm_stops_every_rank(tiny_llama_dir) -> None:
    proc, port, workers, _ = start(tiny_llama_dir)
    try:
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=60)
        assert reply.status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert _gone(workers)
    finally:
        proc.kill()
