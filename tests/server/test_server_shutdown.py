"""SIGINT / SIGTERM: the server stops accepting, ends in-flight streams, stops the engine thread, exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from spawned_server import start_logged, stream_in_background

SCRIPT = Path(__file__).parent / "serve_fake.py"


def start(*options: str) -> tuple[subprocess.Popen, int, list[str]]:
    args = [sys.executable, str(SCRIPT), "--port", "0", "--num-blocks", "128", "--block-size", "4",
            "--max-model-len", "512", "--shutdown-timeout", "0.5", *options]
    return start_logged(args, ready_timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_mid_stream(sig: signal.Signals) -> None:
    proc, port, log = start()
    try:
        assert any("max model len 512; prefix caching on" in line for line in log), "".join(log)
        client, seen = stream_in_background(port, read_timeout=30, started_within=10)
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
