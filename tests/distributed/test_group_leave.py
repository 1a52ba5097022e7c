"""Leaving a rank group joins its gloo threads at once. A gloo thread that outlives the group can free a
collective's last tensor while the interpreter finalizes, which aborts the process at exit."""

import os

import torch.distributed as dist

from pagedllm.distributed.group import RankGroup


def thread_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def test_leave_joins_the_threads_of_the_process_groups() -> None:
    before = thread_ids()
    group = RankGroup.join(0, 1, dist.HashStore())
    group.send_words([7, 8, 9])  # a broadcast, then a barrier: the STOP message's collectives
    group.barrier()
    started = thread_ids() - before
    assert started, "gloo starts worker threads"
    group.leave()
    assert not dist.is_initialized()
    assert started.isdisjoint(thread_ids())
    assert group.control is None and group.data is None
