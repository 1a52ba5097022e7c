"""EngineThread: the served engine is built, warmed up and stepped on one thread (one OpenMP team)."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from conftest import fake_config
from fake_serving_engine import FakeEngine
from pagedllm.engine.async_engine import AsyncEngine, OutputStream
from pagedllm.engine.engine_thread import EngineThread
from pagedllm.entrypoints import openai_server, serve_cmd
from pagedllm.sampling_params import SamplingParams


class _ThreadRecordingEngine(FakeEngine):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.built_on = threading.get_ident()
        self.stepped_on: set[int] = set()

    def step(self):
        self.stepped_on.add(threading.get_ident())
        return super().step()


def test_call_returns_the_result_and_raises_the_error_on_the_caller() -> None:
    thread = EngineThread()
    assert thread.call(threading.get_ident) != threading.get_ident()
    with pytest.raises(ValueError, match="bad config"):
        thread.call(lambda: (_ for _ in ()).throw(ValueError("bad config")))
    assert thread.call(lambda: 42) == 42  # an error does not end the thread
    thread.run_forever(lambda: None)  # a loop that returns at once ends the thread
    thread.join(5)
    assert not thread.is_alive()


def test_a_base_exception_of_a_call_reaches_its_caller_and_the_thread_goes_on() -> None:
    """SystemExit, KeyboardInterrupt and asyncio.CancelledError are not Exceptions: one must not end the thread
    and leave its caller waiting forever."""
    thread, seen = EngineThread(), {}

    def caller() -> None:
        try:
            thread.call(lambda: sys.exit(3))
        except SystemExit as exc:
            seen["code"] = exc.code

    waiting = threading.Thread(target=caller, daemon=True)
    waiting.start()
    waiting.join(10)
    assert seen == {"code": 3}
    assert thread.call(lambda: 42) == 42
    thread.run_forever(lambda: None)
    thread.join(5)


def test_an_idle_engine_thread_does_not_keep_the_process_alive() -> None:
    """A program whose main thread ends exits, though the thread waits for jobs forever."""
    script = "from pagedllm.engine.engine_thread import EngineThread; print(EngineThread().call(lambda: 7))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "7", done.stderr


def test_once_the_loop_is_handed_over_no_other_call_is_taken() -> None:
    thread, release = EngineThread(), threading.Event()
    thread.run_forever(release.wait)
    with pytest.raises(RuntimeError, match="already runs its loop"):
        thread.call(lambda: None)
    with pytest.raises(RuntimeError, match="already runs its loop"):
        thread.run_forever(lambda: None)
    release.set()
    thread.join(5)
    assert not thread.is_alive()


def test_async_engine_steps_the_engine_on_the_thread_that_built_it() -> None:
    thread = EngineThread()
    fake = thread.call(lambda: _ThreadRecordingEngine(fake_config()))

    async def main() -> None:
        engine = AsyncEngine(fake, thread=thread)
        engine.start()
        stream = OutputStream()
        await engine.add_request("a", "hello", SamplingParams(max_tokens=4, ignore_eos=True), stream)
        assert [o async for o in stream][-1].finished
        await engine.stop()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert fake.built_on != threading.get_ident()
    assert fake.stepped_on == {fake.built_on}
    assert not thread.is_alive()


def test_serve_builds_the_engine_on_the_thread_that_will_step_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}

    def load(config):
        seen["load_thread"] = threading.get_ident()
        return FakeEngine(config)

    def build(engine, *args, engine_thread: EngineThread, **kwargs):
        seen["engine_thread"] = engine_thread.call(threading.get_ident)
        return SimpleNamespace(run=lambda sockets: None, engine=SimpleNamespace(fatal=None))

    monkeypatch.setattr(serve_cmd, "load_engine", load)
    monkeypatch.setattr(openai_server, "build_server", build)
    parser = argparse.ArgumentParser()
    serve_cmd.add_arguments(parser)
    assert serve_cmd.run(parser.parse_args(["--port", "0"])) == 0
    assert seen["load_thread"] == seen["engine_thread"] != threading.get_ident()
