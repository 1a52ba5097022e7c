"""Rank 0's side of a tensor-parallel engine: each step goes to every worker in one message, then every
rank runs its shard of the model on it and rank 0 collects what sampling needs.

The scheduler and the block manager run only here; block ids mean the same block on every rank, and each
rank's pool holds its own KV heads of those blocks. Swap calls made by the scheduler are applied here at
once and sent with the next step, which the workers apply before the step's copies and model run: the
same order as here, since nothing touches the cache in between.
"""

import atexit
import logging
import threading
import time

from pagedllm.distributed.group import RankGroup
from pagedllm.distributed.launch import LocalWorkers
from pagedllm.distributed.message import Kind, StepMessage, SwapCall, SwapOp, encode
from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.engine.step_logits import StepLogits
from pagedllm.engine.swap import SwapSpace
from pagedllm.errors import WorkerFailedError
from pagedllm.model.parallel import ParallelLayout

logger = logging.getLogger("pagedllm")


class TensorParallelExecutor:
    def __init__(
        self,
        runner: ModelRunner,
        group: RankGroup,
        layout: ParallelLayout,
        vocab_size: int,
        workers: LocalWorkers | None,
        heartbeat_s: float,
    ) -> None:
        self.runner, self.group, self.layout, self.vocab_size = runner, group, layout, vocab_size
        self.workers = workers  # None under torchrun: the launcher owns the other ranks
        self.swap_space = MirroredSwapSpace(SwapSpace(runner.kv_caches))
        self._lock = threading.Lock()  # one message at a time: the engine's steps and the heartbeat
        self._failure: WorkerFailedError | None = None
        self._closed = False
        self._last_send = time.monotonic()
        self._stopping = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, args=(heartbeat_s,), daemon=True, name="tp-heartbeat")
        self._heartbeat.start()
        atexit.register(self.shutdown)

    @property
    def failure(self) -> WorkerFailedError | None:
        """Why no step can run any more; a local worker that has exited counts even before a step notices."""
        if self._failure is None and self.workers is not None and not self._closed and self.workers.dead():
            with self._lock:
                if self._failure is None:
                    self._fail(RuntimeError("a worker exited"))
        return self._failure

    def execute(self, copies: list[tuple[int, int]], seqs: list[SeqInput], greedy_rows: list[bool]) -> StepLogits:
        if self.failure is not None:
            raise self.failure
        with self._lock:
            if self._closed:
                raise WorkerFailedError("the tensor-parallel engine was shut down")
            message = StepMessage(Kind.STEP, copies, self.swap_space.take_pending(), seqs, greedy_rows)
            try:
                self._send(message)
                self.runner.copy_blocks(copies)
                logits = self.runner.execute(seqs)
                return self.group.reduce_logits(logits, greedy_rows, self.layout, self.vocab_size)
            except Exception as exc:  # a dead or silent peer, or any error that leaves the ranks out of step
                raise self._fail(exc) from exc
            except BaseException as exc:  # Ctrl-C mid-step leaves them out of step too: fail now, not at the next
                self._fail(exc)
                raise

    def shutdown(self) -> None:
        """Stop every worker (a STOP message, then a bounded wait, then a kill) and leave the group; also
        registered to run at exit."""
        self._stopping.set()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._failure is None:
                try:
                    self._send(StepMessage(Kind.STOP))
                    self.group.barrier()  # every rank has read it: no rank tears down a link still in use
                except RuntimeError:
                    pass
        self._heartbeat.join()
        if self.workers is not None:
            self.workers.stop()
        self.group.leave()
        atexit.unregister(self.shutdown)

    # -- internals -----------------------------------------------------------------------------

    def _send(self, message: StepMessage) -> None:
        self.group.send_words(encode(message))
        self._last_send = time.monotonic()

    def _fail(self, cause: BaseException) -> WorkerFailedError:
        dead = self.workers.dead(wait=1.0) if self.workers is not None else []
        what = "; ".join(dead) if dead else (str(cause).splitlines() or [type(cause).__name__])[0]
        self._failure = WorkerFailedError(f"a tensor-parallel rank failed, the engine cannot go on: {what}")
        logger.error("%s", self._failure)
        if self.workers is not None:
            self.workers.kill()
        return self._failure

    def _beat(self, interval: float) -> None:
        """Send a heartbeat when no step went out for `interval` s, so idle workers do not time out."""
        while not self._stopping.wait(interval / 4):
            with self._lock:
                if self._closed or self._failure is not None:
                    return
                if time.monotonic() - self._last_send < interval:
                    continue
                try:
                    self._send(StepMessage(Kind.HEARTBEAT))
                except RuntimeError as exc:
                    self._fail(exc)
                    return


class MirroredSwapSpace:
    """The scheduler's swap space on rank 0: applied here at once, recorded for the workers' next step."""

    def __init__(self, local: SwapSpace) -> None:
        self.local = local
        self._pending: list[SwapCall] = []

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self.local

    def __len__(self) -> int:
        return len(self.local)

    @property
    def tokens_held(self) -> int:
        return self.local.tokens_held

    def save(self, seq_id: int, blocks: list[int], num_tokens: int) -> None:
        self.local.save(seq_id, blocks, num_tokens)
        self._pending.append(SwapCall(SwapOp.SAVE, seq_id, list(blocks), num_tokens))

    def restore(self, seq_id: int, blocks: list[int]) -> None:
        self.local.restore(seq_id, blocks)
        self._pending.append(SwapCall(SwapOp.RESTORE, seq_id, list(blocks)))

    def drop(self, seq_id: int) -> None:
        self.local.drop(seq_id)
        self._pending.append(SwapCall(SwapOp.DROP, seq_id))

    def take_pending(self) -> list[SwapCall]:
        pending, self._pending = self._pending, []
        return pending
