"""Where the ranks come from: on one host the engine spawns its workers itself; across hosts `torchrun`
starts every rank (env:// rendezvous) and rank 0 schedules while the others run the worker loop."""

import multiprocessing
import os
import time

import torch.distributed as dist

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARS)


def torchrun_rank_and_size() -> tuple[int, int]:
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


class LocalWorkers:
    """Ranks 1..size-1 as child processes of rank 0 (spawned: fresh interpreters, nothing forked)."""

    def __init__(self, size: int, store: "dist.TCPStore") -> None:
        from pagedllm.distributed.worker import run_local_worker

        self.store = store  # rank 0's side of the rendezvous: it lives as long as the workers
        context = multiprocessing.get_context("spawn")
        self.processes = [
            context.Process(
                target=run_local_worker, args=(rank, size, store.port, os.getpid()), name=f"pagedllm-tp-rank{rank}",
                daemon=True,  # terminated by multiprocessing at rank 0's exit, should nothing else stop them
            )
            for rank in range(1, size)
        ]
        for process in self.processes:
            process.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def dead(self, wait: float = 0.0) -> list[str]:
        """One line per worker that has exited; `wait` s at most for a first one (a collective can report
        a peer's death before its exit status is in)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and all(p.exitcode is None for p in self.processes):
            time.sleep(0.02)
        return [
            f"rank {rank} (pid {p.pid}) exited with code {p.exitcode}"
            for rank, p in enumerate(self.processes, start=1)
            if p.exitcode is not None
        ]

    def kill(self) -> None:
        """After a failure: no rank can be trusted to answer a STOP, and a stopped one ignores SIGTERM."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(2.0)

    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the workers to leave (after a STOP message), then terminate, then kill what is left."""
        for process in self.processes:
            process.join(timeout)
        alive = [p for p in self.processes if p.is_alive()]
        for process in alive:
            process.terminate()
        for process in alive:
            process.join(2.0)
        self.kill()
