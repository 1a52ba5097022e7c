"""A worker rank: load this rank's shard, then run every step rank 0 sends until it says stop.

A worker never schedules, samples or allocates: it mirrors rank 0's swaps and copies, runs its shard of the
model on the step's tokens (its all-reduces meet rank 0's), and sends rank 0 its part of the logits.
"""

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pagedllm.distributed.group import RankGroup
from pagedllm.distributed.message import Kind, SwapCall, SwapOp, decode
from pagedllm.distributed.sharded_load import load_shard
from pagedllm.distributed.sharding import Shard, vocab_range
from pagedllm.engine.model_runner import ModelRunner
from pagedllm.engine.swap import SwapSpace
from pagedllm.model.parallel import ParallelLayout

logger = logging.getLogger("pagedllm")


@dataclass(slots=True)
class WorkerSpec:
    """What every rank must agree on; rank 0 decides it and broadcasts it once at startup."""

    model: str
    dtype: str  # resolved: "float32" or "bfloat16" (never "auto": hosts may differ)
    num_blocks: int
    block_size: int
    attention_impl: str
    threads: int | None  # intra-op threads per rank; None leaves the launcher's setting
    device_type: str  # "cpu" (gloo) or "cuda" (NCCL; rank r on its host's GPU number local_rank)


def share_spec(group_rank: int, spec: WorkerSpec | None) -> WorkerSpec:
    """Rank 0's spec, on every rank (the startup group, whose timeout covers slow starts)."""
    box = [spec if group_rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def build_rank(group: RankGroup, spec: WorkerSpec) -> tuple[ModelRunner, ParallelLayout, int]:
    """This rank's shard of the model, its runner over its own KV pool, its layout and the full vocab size."""
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    group.use_device(spec.device_type, local_rank(group.rank))
    dtype = getattr(torch, spec.dtype)
    shard = Shard(group.rank, group.size)
    model, config = load_shard(spec.model, dtype, shard, group.device)
    layout = ParallelLayout(group.all_reduce, *vocab_range(config, shard))
    model.set_parallel(layout)
    runner = ModelRunner(
        model, model.config, spec.num_blocks, spec.block_size, dtype, spec.attention_impl, group.device
    )
    return runner, layout, config.vocab_size


def local_rank(rank: int) -> int:
    """The rank's number on its host: torchrun's LOCAL_RANK, else (ranks spawned by rank 0) the rank."""
    return int(os.environ.get("LOCAL_RANK", rank))


def serve_steps(group: RankGroup, runner: ModelRunner, layout: ParallelLayout, vocab_size: int) -> None:
    swap = SwapSpace(runner.kv_caches)
    while True:
        message = decode(group.receive_words())
        if message.kind == Kind.STOP:
            group.barrier()  # rank 0's side of the goodbye (see TensorParallelExecutor.shutdown)
            return
        if message.kind == Kind.HEARTBEAT:
            continue
        for call in message.swaps:
            apply_swap(swap, call)
        runner.copy_blocks(message.copies)
        logits = runner.execute(message.seqs)
        group.reduce_logits(logits, message.greedy_rows, layout, vocab_size)


def apply_swap(swap: SwapSpace, call: SwapCall) -> None:
    if call.op == SwapOp.SAVE:
        swap.save(call.seq_id, call.blocks, call.num_tokens)
    elif call.op == SwapOp.RESTORE:
        swap.restore(call.seq_id, call.blocks)
    else:
        swap.drop(call.seq_id)


def run_worker(group: RankGroup) -> int:
    """Everything a worker rank does after joining the group; its exit status."""
    try:
        spec = share_spec(group.rank, None)
        runner, layout, vocab_size = build_rank(group, spec)
        dist.barrier()  # ready: rank 0 waits here for every shard to be loaded
        serve_steps(group, runner, layout, vocab_size)
    except RuntimeError as exc:  # rank 0 is gone or silent: nothing left to serve
        logger.error("tensor-parallel rank %d stops: %s", group.rank, str(exc).splitlines()[0])
        return 1
    group.leave()
    return 0


def started_key(rank: int) -> str:
    return f"pagedllm/started/{rank}"


def run_local_worker(rank: int, size: int, store_port: int, parent_pid: int) -> None:
    """Entry point of a worker that rank 0 spawned on this host."""
    _exit_with_parent(parent_pid)
    logging.basicConfig(level=logging.WARNING, format=f"rank {rank}: %(levelname)s %(message)s")
    store = dist.TCPStore("127.0.0.1", store_port, size, is_master=False)
    store.set(started_key(rank), "1")  # rank 0 waits for these before it joins the group
    group = RankGroup.join(rank, size, store)
    sys.exit(run_worker(group))


def _exit_with_parent(parent_pid: int) -> None:
    """A spawned worker ends as soon as rank 0's process is gone, however it went."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()

