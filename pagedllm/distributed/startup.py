"""Bringing up a tensor-parallel engine: rank 0's side (from LLMEngine) and a torchrun worker's side."""

import logging
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from pagedllm.distributed.executor import TensorParallelExecutor
from pagedllm.distributed.group import RankGroup, leave_default_group, step_timeout_s
from pagedllm.distributed.launch import LocalWorkers, launched_by_torchrun, torchrun_rank_and_size
from pagedllm.distributed.sharded_load import read_model_config
from pagedllm.distributed.sharding import check_shardable, local_config
from pagedllm.distributed.worker import WorkerSpec, build_rank, run_worker, share_spec, started_key
from pagedllm.engine.pool_memory import check_pool_fits, pool_bytes
from pagedllm.errors import InvalidInputError, WorkerFailedError
from pagedllm.model.config import ModelConfig

logger = logging.getLogger("pagedllm")
WORKER_START_TIMEOUT_S = 300.0  # from spawn to the rendezvous: an interpreter start and the imports


def is_torchrun_worker() -> bool:
    return launched_by_torchrun() and torchrun_rank_and_size()[0] != 0


def run_torchrun_worker() -> int:
    """A rank > 0 under torchrun: join, serve rank 0's steps, and return the exit status."""
    rank, size = torchrun_rank_and_size()
    return run_worker(RankGroup.join(rank, size))


def start_rank0(
    model_path: str, dtype: torch.dtype, device_type: str, size: int, block_size: int, attention_impl: str,
    num_blocks_for: Callable[[ModelConfig], int],
) -> tuple[TensorParallelExecutor, ModelConfig]:
    """Check the split, start or join the other ranks, load rank 0's shard; the executor and the full config.
    `num_blocks_for(local config)` sizes each rank's pool (the same block count on every rank)."""
    if dist.is_initialized():  # torch.distributed holds one default group per process
        raise InvalidInputError("a tensor-parallel engine is already running in this process; call its shutdown() "
                                "first")
    step_timeout_s()  # a bad $PAGEDLLM_TP_TIMEOUT stops here, before anything starts
    full_config = read_model_config(model_path)
    check_shardable(full_config, size)
    local = local_config(full_config, size)
    num_blocks = num_blocks_for(local)
    if device_type == "cpu" and not launched_by_torchrun():  # every rank's pool on this machine
        check_pool_fits(size * pool_bytes(local, num_blocks, block_size, dtype), f"{size} ranks' KV pools")
    group, workers = _join(size, attention_impl)
    try:
        threads = None if workers is None else max(1, torch.get_num_threads() // size)
        spec = WorkerSpec(
            model_path, str(dtype).removeprefix("torch."), num_blocks, block_size, attention_impl, threads, device_type
        )
        share_spec(0, spec)
        runner, layout, vocab_size = build_rank(group, spec)
        dist.barrier()  # every rank's shard is loaded
    except BaseException:
        if workers is not None:
            workers.kill()
        group.leave()
        raise
    pids = "" if workers is None else f", worker pids {' '.join(map(str, workers.pids))}"
    logger.info("tensor parallel: %d ranks (%s), step timeout %.0f s%s", size, group.backend, step_timeout_s(), pids)
    executor = TensorParallelExecutor(runner, group, layout, vocab_size, workers, heartbeat_s=step_timeout_s() / 2)
    return executor, full_config


def _join(size: int, attention_impl: str) -> tuple[RankGroup, LocalWorkers | None]:
    if launched_by_torchrun():
        rank, world = torchrun_rank_and_size()
        if world != size:
            raise InvalidInputError(f"tensor_parallel_size is {size} but torchrun started {world} processes")
        return RankGroup.join(rank, size), None
    _build_kernels_once(attention_impl)
    workers = LocalWorkers(size, dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False))
    try:
        _wait_until_started(workers, size)
        return RankGroup.join(0, size, workers.store), workers
    except BaseException:
        workers.kill()
        leave_default_group()  # a worker lost after the default group formed: another engine can start
        raise


def _wait_until_started(workers: LocalWorkers, size: int, timeout: float = WORKER_START_TIMEOUT_S) -> None:
    """Every spawned worker reached the rendezvous; a worker that died first (a script that builds an engine
    at its top level re-runs in every spawned worker and fails there) is reported instead of waited for."""
    keys = [started_key(rank) for rank in range(1, size)]
    deadline = time.monotonic() + timeout
    while not workers.store.check(keys):
        if dead := workers.dead():
            raise WorkerFailedError(
                f"a tensor-parallel worker failed to start ({'; '.join(dead)}). Workers are spawned: a script "
                'that builds the engine must keep its top level under `if __name__ == "__main__":`'
            )
        if time.monotonic() > deadline:
            raise WorkerFailedError(f"tensor-parallel workers did not start within {timeout:.0f} s")
        time.sleep(0.05)


def _build_kernels_once(attention_impl: str) -> None:
    """Build (or find in the cache) the compiled kernels before the workers start, so they never race to."""
    if attention_impl in ("auto", "compiled"):
        from pagedllm.kernels import load_cpu_kernels

        load_cpu_kernels()
