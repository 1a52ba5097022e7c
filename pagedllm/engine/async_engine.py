"""AsyncEngine: the synchronous LLMEngine stepped in one background thread beside an asyncio loop.

The engine object is touched only by that thread (an EngineThread, which may also have built it:
see engine_thread.py for why that matters on the CPU). The event loop talks to it through a
command queue (add, abort, read stats, ...) and gets outputs back on per-caller asyncio
queues, a step's outputs in one ``loop.call_soon_threadsafe``. When there is nothing to do
the thread sleeps on a condition variable; it never spins.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pagedllm.engine.engine_thread import EngineThread
from pagedllm.engine.outputs import RequestOutput
from pagedllm.engine.stats import EngineStats
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
STATS_INTERVAL = 0.05  # seconds
FAILURE_POLL = 1.0  # seconds between checks, while idle, that the engine can still run (its workers live)
SHUTTING_DOWN = "the server is shutting down"  # why requests are refused and ended at shutdown


class EngineProtocol(Protocol):
    """What AsyncEngine needs from LLMEngine (a test fake can follow it too)."""

    config: Any
    model_config: Any  # .vocab_size
    tokenizer: Any
    max_model_len: int
    model_name: str
    sampling_defaults: dict[str, Any]  # a request's sampling fields where it leaves them out

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None, cache_salt: str | None = None, priority: int = 0) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def compile_constraint(self, params: SamplingParams) -> object | None: ...  # thread-safe
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def stats(self) -> EngineStats: ...


def engine_failure(engine: EngineProtocol) -> BaseException | None:
    """Why the engine can never step again (a tensor-parallel worker died or hung), else None."""
    return getattr(engine, "failure", None)


class RequestAborted(Exception):
    """The engine ended a request without finishing it (shutdown or an engine failure)."""


class FinishObserver(Protocol):
    def update_from_stats(self, stats: EngineStats) -> None: ...
    def observe_finished(self, output: RequestOutput) -> None: ...


class OutputStream:
    """Outputs of one or more engine requests, for one caller, read on the event loop."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._live: set[str] = set()

    def expect(self, request_id: str) -> None:
        self._live.add(request_id)

    def forget(self, request_id: str) -> None:
        self._live.discard(request_id)

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while self._live:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                self._live.discard(item.request_id)
            yield item


@dataclass(slots=True)
class _Command:
    fn: Callable[[Any], Any]
    future: asyncio.Future | None = None


class AsyncEngine:
    def __init__(self, engine: EngineProtocol, observer: FinishObserver | None = None,
                 max_waiting_requests: int | None = None, on_idle: Callable[[], Any] | None = None,
                 on_fatal: Callable[[BaseException], Any] | None = None,
                 thread: EngineThread | None = None) -> None:
        self._engine = engine
        self._on_idle = on_idle  # run on the engine thread each time the last request ends
        self._on_fatal = on_fatal  # run on the event loop once the engine can no longer step
        self.fatal: BaseException | None = None
        self._observer = observer
        self.max_waiting_requests = max_waiting_requests
        self.config = engine.config
        self.model_name: str = engine.model_name
        self.max_model_len: int = engine.max_model_len
        self.vocab_size: int = engine.model_config.vocab_size
        self.sampling_defaults: dict[str, Any] = engine.sampling_defaults
        # A private copy for the event loop (decoding logprob tokens, echo): HF fast
        # tokenizers are not safe to share between threads.
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        self.latest_stats: EngineStats = engine.stats()
        if observer is not None:
            observer.update_from_stats(self.latest_stats)
        self._cond = threading.Condition()
        self._commands: deque[_Command] = deque()
        self._streams: dict[str, OutputStream] = {}  # engine thread only
        self._pending_adds = 0
        self._added_unseen = 0  # added since latest_stats was taken: waiting, though the stats do not say so yet
        self._busy = False
        self._stats_time = 0.0
        self._stopping = False
        self._refusal: str | None = None  # why new requests are refused (the server is shutting down)
        self._closed = False  # the thread ended: every later command is refused (under _cond)
        self._given_thread = thread  # the one that built the engine, if any; else start() makes one
        self._thread: EngineThread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- event-loop side ---------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = self._given_thread or EngineThread()
        self._thread.run_forever(self._run)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    async def stop(self, timeout: float = 10.0) -> None:
        """Abort every live request and stop the thread (waits at most `timeout` seconds)."""
        if self._thread is None:
            return
        self._submit(_Command(fn=self._begin_stop))
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            logger.warning("engine thread did not stop within %.1f s", timeout)

    async def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` s for every request to finish; True if none is left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._has_live_requests() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return not self._has_live_requests()

    def refuse_new_requests(self, reason: str = SHUTTING_DOWN) -> None:
        """From now on add_request(s) raise RequestAborted(reason); requests already added go on."""
        self._refusal = reason

    def abort_all(self, reason: str = SHUTTING_DOWN) -> None:
        """Fire and forget: abort every live request; their callers get RequestAborted."""
        if self._thread is not None:
            self._submit(_Command(fn=lambda engine: self._abort_all(RequestAborted(reason))))

    def _has_live_requests(self) -> bool:
        stats = self.latest_stats
        return self._pending_adds + self._added_unseen > 0 or stats.num_running > 0 or stats.num_waiting > 0

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(engine) on the engine thread between steps and return its result."""
        if not self.running:
            raise RequestAborted("the engine is not running")
        future = asyncio.get_running_loop().create_future()
        self._submit(_Command(fn=fn, future=future))
        return await future

    async def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                          stream: OutputStream, cache_salt: str | None = None, priority: int = 0) -> None:
        """Queue a request; raises the engine's InvalidInputError if it is rejected."""
        await self.add_requests([(request_id, prompt)], params, stream, cache_salt, priority)

    async def add_requests(self, requests: list[tuple[str, str | list[int]]], params: SamplingParams,
                           stream: OutputStream, cache_salt: str | None = None, priority: int = 0) -> None:
        """Queue (request id, prompt) pairs in one command, so that they join the same step: all of them, or
        none where the engine rejects one (its InvalidInputError is raised)."""
        if self._refusal is not None:
            raise RequestAborted(self._refusal)
        if params.structured_outputs is not None:  # compiled here, off the engine thread (engine/grammar.py)
            await asyncio.to_thread(self._engine.compile_constraint, params)
        pending = [len(requests)]  # counted until the command runs or the caller stops waiting for it
        arrival = time.time()  # now, not when the engine thread takes the command (after its current step)

        def no_longer_pending() -> None:
            with self._cond:
                self._pending_adds -= pending[0]
                pending[0] = 0

        def add(engine: EngineProtocol) -> None:
            no_longer_pending()
            added: list[str] = []
            try:
                for request_id, prompt in requests:
                    engine.add_request(request_id, prompt, params, arrival_time=arrival, cache_salt=cache_salt,
                                       priority=priority)
                    added.append(request_id)
            except BaseException:
                for request_id in added:
                    engine.abort_request(request_id)
                raise
            for request_id in added:
                self._streams[request_id] = stream
            with self._cond:
                self._added_unseen += len(added)

        for request_id, _ in requests:
            stream.expect(request_id)
        self._count_pending(+len(requests))
        try:
            await self.call(add)
        except BaseException:  # rejected; or never queued, refused by a failed engine, or its caller left
            no_longer_pending()
            for request_id, _ in requests:
                stream.forget(request_id)
            raise

    def abort(self, request_id: str) -> None:
        """Fire and forget: frees the request's blocks before the next step."""
        if self._thread is not None:
            self._submit(_Command(fn=lambda engine: self._abort_one(request_id, None)))

    def is_overloaded(self) -> bool:
        limit = self.max_waiting_requests
        waiting = self.latest_stats.num_waiting + self._pending_adds + self._added_unseen
        return limit is not None and waiting >= limit

    async def stats(self) -> EngineStats:
        return await self.call(lambda engine: engine.stats())

    async def kv_snapshot(self, offset: int = 0, limit: int | None = None) -> dict:
        return await self.call(lambda engine: engine.kv_snapshot(offset, limit))

    def _count_pending(self, delta: int) -> None:
        with self._cond:
            self._pending_adds += delta

    def _submit(self, command: _Command) -> None:
        with self._cond:
            if self.fatal is None and not self._closed:
                self._commands.append(command)
                self._cond.notify()
                return
        self._reject(command)

    def _reject(self, command: _Command) -> None:
        if command.future is not None:
            reason = f"the engine failed: {self.fatal}" if self.fatal is not None else "the engine is not running"
            self._to_loop(_resolve, command.future, None, RequestAborted(reason))

    def _close(self) -> list[_Command]:
        """Refuse every later command; returns those queued and not run."""
        with self._cond:
            self._closed = True
            commands = list(self._commands)
            self._commands.clear()
        return commands

    # ---- engine-thread side ------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # outside a step (stats, an observer, a hook): fail as a dead engine would
            logger.exception("the engine thread failed")
            self._fail(exc)

    def _serve(self) -> None:
        while True:
            commands = self._wait_for_work()
            for command in commands:
                self._execute(command)
            if self._stopping:
                self._abort_all(RequestAborted(SHUTTING_DOWN))
                for command in self._close():
                    self._reject(command)
                return
            if self._busy:
                self._step()
            if self._failed():
                return
            self._after_iteration(force_stats=bool(commands))

    def _wait_for_work(self) -> list[_Command]:
        with self._cond:
            while not self._commands and not self._busy:
                self._cond.wait(FAILURE_POLL)
                if engine_failure(self._engine) is not None:
                    break
            commands = list(self._commands)
            self._commands.clear()
        return commands

    def _failed(self) -> bool:
        """If the engine can never step again: fail every request with the reason, stop, tell the server."""
        failure = engine_failure(self._engine)
        if failure is None:
            return False
        logger.error("the engine cannot run any more: %s", failure)
        self._fail(failure)
        return True

    def _fail(self, failure: BaseException) -> None:
        """Fail every request with the reason, refuse every command, tell the server."""
        with self._cond:  # from here on _submit answers every command itself
            self.fatal, self._stopping = failure, True
        commands = self._close()
        try:
            self._abort_all(RequestAborted(f"the engine failed: {failure}"))
        except Exception:  # the streams have their reason; the engine's own state is past caring for
            logger.exception("the engine failed while aborting its requests")
        for command in commands:
            self._reject(command)
        if self._on_fatal is not None:
            self._to_loop(self._on_fatal, failure)

    def _execute(self, command: _Command) -> None:
        try:
            result, error = command.fn(self._engine), None
        except Exception as exc:  # handed back to the caller; the thread keeps going
            result, error = None, exc
        if command.future is not None:
            self._to_loop(_resolve, command.future, result, error)
        elif error is not None:
            logger.warning("engine command failed: %s", error)

    def _to_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is left to tell
            pass

    def _step(self) -> None:
        try:
            outputs = self._engine.step()
        except Exception as exc:
            if engine_failure(self._engine) is not None:
                return  # _failed() answers every request with the reason
            logger.exception("engine step failed; aborting all requests")
            self._abort_all(RequestAborted(f"the engine failed while running this request: {exc}"))
            return
        streams = [self._release_or_get_stream(output) for output in outputs]
        deliveries = [(stream, output) for stream, output in zip(streams, outputs) if stream is not None]
        if deliveries:  # one wake-up of the event loop per step, not one per request
            self._to_loop(_put_all, deliveries)

    def _release_or_get_stream(self, output: RequestOutput) -> OutputStream | None:
        """The stream the output goes to; a finished request's stream is released (and the observer told)."""
        if not output.finished:
            return self._streams.get(output.request_id)
        if self._observer is not None:
            self._observer.observe_finished(output)
        return self._streams.pop(output.request_id, None)

    def _after_iteration(self, force_stats: bool) -> None:
        was_busy, self._busy = self._busy, self._engine.has_unfinished_requests()
        if was_busy and not self._busy and self._on_idle is not None:
            self._on_idle()
        now = time.monotonic()
        # Stats walk the pool; while busy, refresh them at most every STATS_INTERVAL unless the
        # queue changed. They are always fresh once the engine goes idle.
        if force_stats or not self._busy or now - self._stats_time >= STATS_INTERVAL:
            self._stats_time = now
            self._publish_stats(self._engine.stats())
            if self._observer is not None:
                self._observer.update_from_stats(self.latest_stats)

    def _abort_one(self, request_id: str, reason: BaseException | None) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return  # finished already, or never admitted
        try:
            self._engine.abort_request(request_id)
        finally:  # the caller hears of it even if the engine could not abort
            if reason is not None:
                self._to_loop(stream.put, reason)

    def _abort_all(self, reason: BaseException) -> None:
        for request_id in list(self._streams):
            try:
                self._abort_one(request_id, reason)
            except Exception:
                logger.exception("could not abort request %s", request_id)
        self._streams.clear()
        self._busy = self._engine.has_unfinished_requests()
        self._publish_stats(self._engine.stats())

    def _publish_stats(self, stats: EngineStats) -> None:
        """The engine's stats for the event loop: from now on they count every request added so far."""
        with self._cond:
            self.latest_stats, self._added_unseen = stats, 0

    def _begin_stop(self, engine: EngineProtocol) -> None:
        self._stopping = True


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _put_all(deliveries: list[tuple[OutputStream, RequestOutput]]) -> None:
    for stream, output in deliveries:
        stream.put(output)
