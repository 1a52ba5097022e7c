"""A server command run as a child process, up once its log names the port it listens on."""

import re
import subprocess
import threading
import time
from pathlib import Path

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
