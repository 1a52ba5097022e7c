"""Start `pagedllm serve` as a child process on 127.0.0.1 for one benchmark run, and stop it after.

The server binds port 0 and logs the port it got; we read that line from its stderr, so no port
is ever guessed. Its remaining output is drained in a thread so a chatty server never blocks.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pagedllm.errors import UserFacingError

_SERVING_LINE = re.compile(r"serving .* on http://([\d.]+):(\d+)")


@dataclass
class LaunchedServer:
    process: subprocess.Popen[str]
    base_url: str
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=50))

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (a graceful drain), then SIGKILL if it outlives `timeout_s`; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def serve_command(model: str | None, serve_args: Sequence[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pagedllm", "serve", "--host", "127.0.0.1", "--port", "0", "--log-level", "info"]
    if model:
        cmd += ["--model", model]
    return cmd + list(serve_args)


def launch(model: str | None, serve_args: Sequence[str], startup_timeout_s: float = 300.0) -> LaunchedServer:
    """A running `pagedllm serve`, once it has logged its address; raises with its last log lines if it fails."""
    process = subprocess.Popen(serve_command(model, serve_args), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, bufsize=1)
    server = LaunchedServer(process, base_url="")
    found = threading.Event()
    reader = threading.Thread(target=_read_log, args=(server, found), daemon=True, name="pagedllm-serve-log")
    reader.start()
    deadline = time.monotonic() + startup_timeout_s
    while not found.wait(0.1):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop(5)
            reader.join(2)
            tail = "\n".join(server.log_tail)
            raise UserFacingError(f"`pagedllm serve` did not start (exit {process.returncode}):\n{tail}")
    return server


def _read_log(server: LaunchedServer, found: threading.Event) -> None:
    assert server.process.stderr is not None
    for line in server.process.stderr:
        server.log_tail.append(line.rstrip())
        match = _SERVING_LINE.search(line) if not found.is_set() else None
        if match:
            server.base_url = f"http://{match.group(1)}:{match.group(2)}"
            found.set()
