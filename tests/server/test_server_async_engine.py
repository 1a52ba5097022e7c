"""AsyncEngine on its own: outputs reach the loop, aborts free blocks, the idle thread sleeps."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from conftest import fake_config
from fake_serving_engine import FakeEngine
from pagedllm.engine.async_engine import AsyncEngine, OutputStream, RequestAborted, _Command
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams


def run(coro, timeout: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_outputs_arrive_until_finished() -> None:
    async def main() -> list:
        engine = AsyncEngine(FakeEngine(fake_config()))
        engine.start()
        stream = OutputStream()
        await engine.add_request("a", "hello", SamplingParams(max_tokens=5, ignore_eos=True), stream)
        outputs = [o async for o in stream]
        await engine.stop()
        return outputs

    outputs = run(main())
    assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 5
    assert not any(o.finished for o in outputs[:-1])


def test_invalid_request_raises_to_the_caller() -> None:
    async def main() -> None:
        engine = AsyncEngine(FakeEngine(fake_config()))
        engine.start()
        try:
            with pytest.raises(InvalidInputError):
                await engine.add_request("a", "", SamplingParams(), OutputStream())
            assert engine.latest_stats.num_waiting == 0
        finally:
            await engine.stop()

    run(main())


def test_abort_frees_blocks_and_idle_thread_does_not_spin() -> None:
    fake = FakeEngine(fake_config(), step_delay=0.005)

    async def main() -> None:
        engine = AsyncEngine(fake)
        engine.start()
        stream = OutputStream()
        await engine.add_request("a", "hello", SamplingParams(max_tokens=200, ignore_eos=True), stream)
        async for output in stream:
            if len(output.outputs[0].token_ids) >= 3:
                break
        assert (await engine.stats()).blocks_used > 0
        engine.abort("a")
        await engine.call(lambda e: None)  # runs after the abort, between steps
        stats = await engine.stats()
        assert (stats.num_running, stats.blocks_used) == (0, 0)
        steps = fake.step_calls
        await asyncio.sleep(0.3)
        assert fake.step_calls == steps  # asleep on the condition, not stepping
        await engine.stop()

    run(main())


def test_stop_aborts_live_requests() -> None:
    async def main() -> None:
        engine = AsyncEngine(FakeEngine(fake_config(), step_delay=0.005))
        engine.start()
        stream = OutputStream()
        await engine.add_request("a", "hello", SamplingParams(max_tokens=200, ignore_eos=True), stream)
        began = time.monotonic()
        await engine.stop()
        assert time.monotonic() - began < 5
        with pytest.raises(RequestAborted):
            async for _ in stream:
                pass
        assert not engine.running

    run(main())


class _FailOnce(FakeEngine):
    def step(self):
        if not getattr(self, "failed", False):
            self.failed = True
            raise RuntimeError("boom")
        return super().step()


def test_engine_failure_ends_requests_and_the_thread_carries_on() -> None:
    async def main() -> None:
        engine = AsyncEngine(_FailOnce(fake_config()))
        engine.start()
        try:
            first = OutputStream()
            await engine.add_request("a", "hello", SamplingParams(max_tokens=3), first)
            with pytest.raises(RequestAborted):
                async for _ in first:
                    pass
            second = OutputStream()
            await engine.add_request("b", "hello", SamplingParams(max_tokens=3), second)
            assert [o async for o in second][-1].finished
            assert (await engine.stats()).blocks_used == 0
        finally:
            await engine.stop()

    run(main())


def test_on_idle_runs_once_each_time_the_last_request_ends() -> None:
    calls: list[int] = []

    async def main() -> None:
        engine = AsyncEngine(FakeEngine(fake_config()), on_idle=lambda: calls.append(1))
        engine.start()
        for burst in range(2):
            streams = [OutputStream() for _ in range(3)]
            for i, stream in enumerate(streams):
                await engine.add_request(f"r{burst}-{i}", "hello", SamplingParams(max_tokens=4 + i), stream)
            for stream in streams:
                _ = [o async for o in stream]
            while engine.latest_stats.num_running:  # the thread may not have gone idle yet
                await asyncio.sleep(0.005)
        engine.abort("unknown")  # wakes the idle thread, which stays idle: no call
        await asyncio.sleep(0.05)
        await engine.stop()

    run(main())
    assert len(calls) == 2



def test_a_batch_of_requests_joins_one_step() -> None:
    fake = FakeEngine(fake_config(), step_delay=0.005)

    async def main() -> list:
        engine = AsyncEngine(fake)
        engine.start()
        stream = OutputStream()
        requests = [(f"r{i}", "hello") for i in range(20)]
        await engine.add_requests(requests, SamplingParams(max_tokens=3, ignore_eos=True), stream)
        outputs = [o async for o in stream]
        await engine.stop()
        return outputs

    outputs = run(main())
    first_tokens = [o for o in outputs if len(o.outputs[0].token_ids) == 1]
    assert len(first_tokens) == 20
    # every request's first token came out of the same step: the first 20 outputs
    assert {o.request_id for o in outputs[:20]} == {f"r{i}" for i in range(20)}
    assert sum(o.finished for o in outputs) == 20


def test_a_rejected_request_keeps_its_whole_batch_out() -> None:
    async def main() -> None:
        engine = AsyncEngine(FakeEngine(fake_config()))
        engine.start()
        try:
            with pytest.raises(InvalidInputError):
                await engine.add_requests([("a", "hello"), ("b", ""), ("c", "hello")],
                                          SamplingParams(max_tokens=50), OutputStream())
            stats = await engine.stats()
            assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)
            assert not engine.is_overloaded() and engine._pending_adds == 0
        finally:
            await engine.stop()

    run(main())


def test_a_submission_admits_its_prompts_in_one_step() -> None:
    """One engine command for all of a call's prompts: one at a time, 20 prompts took 20 steps to admit, and the
    first had 19 tokens before the last was in (a client that left meanwhile went unnoticed until then)."""
    from pagedllm.entrypoints.server.submission import Submission

    async def main() -> int:
        engine = AsyncEngine(FakeEngine(fake_config(), step_delay=0.005))
        engine.start()
        try:
            submission = Submission(engine, "cmpl")
            await submission.add([[5, 6, 7]] * 20, SamplingParams(max_tokens=200, ignore_eos=True), None)
            generated = (await engine.stats()).generation_tokens_total
            submission.abort_unfinished()
            return generated
        finally:
            await engine.stop()

    assert run(main()) <= 2 * 20  # at most a step or two of all 20 by the time add() returned


def test_arrival_is_when_the_request_is_handed_over_not_when_the_step_ends() -> None:
    fake = FakeEngine(fake_config(), step_delay=0.3)  # a long step: a request handed over meanwhile waits for it

    async def main() -> tuple[float, float]:
        engine = AsyncEngine(fake)
        engine.start()
        first = OutputStream()
        await engine.add_request("a", "hello", SamplingParams(max_tokens=3, ignore_eos=True), first)
        await asyncio.sleep(0.05)  # inside a step now
        second, handed_over = OutputStream(), time.time()
        await engine.add_request("b", "hello", SamplingParams(max_tokens=1, ignore_eos=True), second)
        outputs = [o async for o in second]
        await engine.stop()
        return handed_over, outputs[-1].metrics.arrival_time

    handed_over, arrival = run(main())
    assert handed_over <= arrival < handed_over + 0.1


class _StatsFailOnce(FakeEngine):
    """stats() raises once while a request runs: a failure on the engine thread outside step()."""

    def stats(self):
        if self.running and not getattr(self, "failed", False):
            self.failed = True
            raise RuntimeError("stats broke")
        return super().stats()


def test_a_failure_outside_the_step_fails_the_engine_instead_of_hanging() -> None:
    fatal: list[BaseException] = []

    async def main() -> None:
        engine = AsyncEngine(_StatsFailOnce(fake_config(), step_delay=0.01), on_fatal=fatal.append)
        engine.start()
        stream = OutputStream()
        await engine.add_request("a", "hello", SamplingParams(max_tokens=50, ignore_eos=True), stream)
        with pytest.raises(RequestAborted, match="stats broke"):
            async for _ in stream:
                pass
        with pytest.raises(RequestAborted):
            await engine.add_request("b", "hello", SamplingParams(max_tokens=3), OutputStream())
        await asyncio.sleep(0.05)  # on_fatal reaches the loop
        await engine.stop()

    run(main())
    assert [str(f) for f in fatal] == ["stats broke"]


def test_requests_are_refused_once_the_server_shuts_down() -> None:
    async def main() -> None:
        engine = AsyncEngine(FakeEngine(fake_config()))
        engine.start()
        engine.refuse_new_requests()
        with pytest.raises(RequestAborted, match="shutting down"):
            await engine.add_request("a", "hello", SamplingParams(max_tokens=3), OutputStream())
        assert not engine._has_live_requests()
        await engine.stop()

    run(main())


def test_a_call_queued_as_the_thread_stops_is_refused_not_left_waiting() -> None:
    async def main() -> None:
        engine = AsyncEngine(FakeEngine(fake_config()))
        engine.start()
        def slow_then_stop(e) -> None:
            time.sleep(0.3)
            engine._begin_stop(e)  # the thread ends after this batch of commands

        engine._submit(_Command(fn=slow_then_stop))
        await asyncio.sleep(0.05)  # inside the slow command: the next call queues behind the batch
        with pytest.raises(RequestAborted, match="not running"):
            await asyncio.wait_for(engine.call(lambda e: None), 5)
        await engine.stop()

    run(main())


class _GatedSteps(FakeEngine):
    """Each step waits for the test to open the gate."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Semaphore(0)

    def step(self):
        self.gate.acquire()
        return super().step()


def test_requests_added_before_a_step_count_as_waiting_for_the_overload_limit() -> None:
    fake = _GatedSteps(fake_config(max_num_seqs=1))

    async def main() -> None:
        engine = AsyncEngine(fake, max_waiting_requests=4)
        engine.start()
        await engine.add_request("first", "hello", SamplingParams(max_tokens=20), OutputStream())
        await asyncio.sleep(0.05)  # the thread waits inside the first request's step
        streams = [OutputStream() for _ in range(4)]
        adds = asyncio.gather(*(engine.add_request(f"r{i}", "hello", SamplingParams(max_tokens=2), stream)
                                for i, stream in enumerate(streams)))
        await asyncio.sleep(0.05)  # queued behind the step
        fake.gate.release()  # the step ends, the four are added, the next step waits: no stats taken in between
        await adds
        assert engine.latest_stats.num_waiting == 0 and engine.is_overloaded()
        for _ in range(100):
            fake.gate.release()
        await engine.stop()

    run(main())


def test_drain_counts_a_request_the_stats_do_not_show_yet() -> None:
    async def main() -> bool:
        fake = FakeEngine(fake_config())
        engine = AsyncEngine(fake)
        engine.start()
        stats = fake.stats
        fake.stats = lambda: (time.sleep(0.3), stats())[1]  # the engine thread publishes its stats late
        try:
            await engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=40), OutputStream())
            return await engine.drain(0)
        finally:
            await engine.stop()

    assert not run(main())


def test_an_add_that_never_ran_is_not_left_pending() -> None:
    """Else the overload limit and drain would count it for ever."""
    async def main() -> None:
        engine = AsyncEngine(FakeEngine(fake_config()), max_waiting_requests=1)  # never started
        with pytest.raises(RequestAborted):
            await engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=4), OutputStream())
        assert not engine.is_overloaded()
        assert await engine.drain(0)

    run(main())


def test_finished_requests_release_their_streams() -> None:
    async def main() -> dict:
        engine = AsyncEngine(FakeEngine(fake_config()))
        engine.start()
        for i in range(3):
            stream = OutputStream()
            await engine.add_request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=2), stream)
            [o async for o in stream]
        streams = dict(engine._streams)
        await engine.stop()
        return streams

    assert run(main()) == {}


def test_an_engine_that_fails_while_idle_is_noticed_without_a_request(monkeypatch) -> None:
    """A tensor-parallel worker that dies while nothing runs: the server learns it at once, not at the next
    request."""
    import pagedllm.engine.async_engine as async_engine

    monkeypatch.setattr(async_engine, "FAILURE_POLL", 0.02)

    async def main() -> BaseException | None:
        fake = FakeEngine(fake_config())
        engine = AsyncEngine(fake)
        engine.start()
        fake.failure = RuntimeError("worker 1 died")
        deadline = time.monotonic() + 5
        while engine.fatal is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await engine.stop()
        return engine.fatal

    assert str(run(main())) == "worker 1 died"
