"""EngineThread: the one thread that builds, warms up and then steps an engine served beside an event loop.

Why one thread: PyTorch's CPU ops run on OpenMP, and libgomp keeps a team of worker threads for each
thread that has started a parallel region. Once the process holds more of those workers than it has
CPUs, libgomp cuts the workers' spin-wait to a few hundred iterations, so they sleep between ops and
each op pays a futex wake-up. Loading the model on the main thread and stepping it on another made
two teams and cost 5-7 % of throughput on a 2-core machine (docs/benchmarks.md). Doing both on this
thread keeps one team, as when everything runs on the main thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class EngineThread:
    """A daemon thread that runs calls in order: `call` waits for a result, `run_forever` hands it a loop."""

    def __init__(self, name: str = "pagedllm-engine") -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future | None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self._handed_over = False

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn() on the thread and return its result (or raise its exception) here."""
        if self._handed_over:
            raise RuntimeError("the engine thread already runs its loop")
        done: Future = Future()
        self._jobs.put((fn, done))
        return done.result()

    def run_forever(self, loop: Callable[[], object]) -> None:
        """Give the thread its last job; the thread ends when `loop` returns."""
        if self._handed_over:
            raise RuntimeError("the engine thread already runs its loop")
        self._handed_over = True
        self._jobs.put((loop, None))

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _serve(self) -> None:
        while True:
            fn, done = self._jobs.get()
            if done is None:
                fn()
                return
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller of call()
                done.set_exception(exc)
