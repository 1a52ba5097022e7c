"""A server command run as a child process, up once its log names the port it listens on; a long streamed
completion read from it in the background."""

import re
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def start_logged(args: list[str], ready_timeout: float, env: dict[str, str] | None = None,
                 ) -> tuple[subprocess.Popen, int, list[str]]:
    """The process, its port, and its stderr lines (still growing, read by a thread after startup)."""
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    log: list[str] = []
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        if match := re.search(r"on http://127\.0\.0\.1:(\d+)", line):
            threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
            return proc, int(match.group(1)), log
    proc.kill()
    pytest.fail("server did not start:\n" + "".join(log))


def stream_in_background(port: int, read_timeout: float, started_within: float) -> tuple[threading.Thread, list[str]]:
    """A thread streaming a 400-token completion into the returned list (its SSE lines, then
    "<connection error>" if the connection breaks), returned once 5 lines have arrived."""
    seen: list[str] = []

    def read() -> None:
        body = {"prompt": "go", "max_tokens": 400, "ignore_eos": True, "stream": True}
        try:
            url = f"http://127.0.0.1:{port}/v1/completions"
            with httpx.stream("POST", url, json=body, timeout=read_timeout) as response:
                for line in response.iter_lines():
                    seen.append(line)
        except httpx.HTTPError:
            seen.append("<connection error>")

    client = threading.Thread(target=read, daemon=True)
    client.start()
    deadline = time.monotonic() + started_within
    while len(seen) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(seen) >= 5, "the stream never started"
    return client, seen
