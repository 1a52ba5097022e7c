"""SIGINT / SIGTERM: the server stops accepting, ends in-flight streams, stops the engine thread, exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from spawned_server import start_logged

SCRIPT = Path(__file__).parent / "serve_fake.py"


def start(*options: str) -> tuple[subprocess.Popen, int, list[str]]:
    args = [sys.executable, str(SCRIPT), "--port", "0", "--num-blocks", "128", "--block-size", "4",
            "--max-model-len", "512", "--shutdown-timeout", "0.5", *options]
    return start_logged(args, ready_timeout=30)


def stream_until_closed(port: int, seen: list[str]) -> None:
    body = {"prompt": "go", "max_tokens": 400, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                seen.append(line)
    except httpx.HTTPError:
        seen.append("<connection error>")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_mid_stream(sig: signal.Signals) -> None:
    proc, port, log = start()
    try:
        assert any("KV pool: 128 blocks x 4 tokens" in line for line in log), "".join(log)
        seen: list[str] = []
        client = threading.Thread(target=stream_until_closed, args=(port, seen), daemon=True)
        client.start()
        deadline = time.monotonic() + 10
        while len(seen) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(seen) >= 5, "the stream never started"
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0, "".join(log)
        client.join(10)
        assert not client.is_alive()
        data = [line for line in seen if line.startswith("data: ")]
        assert data[-1] == "data: [DONE]"  # the aborted stream still ends well-formed
        assert "error" in json.loads(data[-2][6:])
        assert "Traceback" not in "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_idle_server_exits_fast() -> None:
    proc, port, log = start()
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - began < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
