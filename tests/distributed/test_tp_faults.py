"""Tensor-parallel faults: a killed or hung worker fails the requests with a clear error in bounded time,
idle workers stay alive, a killed rank 0 takes its workers with it, shutdown is prompt, and nothing is left
running afterwards (checked by PID)."""

import os
import signal
import time

import pytest
from tp_helpers import alive, children, completions, make_llm

from pagedllm import SamplingParams
from pagedllm.engine.model_runner import SeqInput
from pagedllm.errors import InvalidInputError, ModelLoadError, WorkerFailedError

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def _workers(llm) -> list[int]:
    pids = llm.engine.executor.workers.pids
    assert sorted(pids) == sorted(set(children(os.getpid())) & set(pids))
    return pids


def _assert_gone(pids: list[int], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), f"orphan workers: {[p for p in pids if alive(p)]}"


@pytest.mark.parametrize("what", ["max_model_len", "tokenizer"])
def test_a_start_that_fails_after_the_workers_loaded_stops_them(tiny_llama_dir, tmp_path, what) -> None:
    import shutil

    model, options = tiny_llama_dir, {}
    if what == "tokenizer":
        model = tmp_path / "no-tokenizer"
        model.mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copy(tiny_llama_dir / name, model / name)
    else:
        options["max_model_len"] = 4096
    before = set(children(os.getpid()))
    with pytest.raises(ModelLoadError if what == "tokenizer" else InvalidInputError, match=what):
        make_llm(model, 2, **options)
    _assert_gone(sorted(set(children(os.getpid())) - before))
    llm = make_llm(tiny_llama_dir, 2)  # the process can start another one: the group was left
    try:
        assert completions(llm, ["Hello"], GREEDY)[0][0][0]
    finally:
        llm.engine.shutdown()


def test_an_interrupt_mid_step_fails_the_engine_at_once(tiny_llama_dir, monkeypatch) -> None:
    """Ctrl-C between the step message and the all-reduces leaves the ranks out of step: the engine fails then,
    its workers stopped at once, instead of hanging the next step for the whole timeout."""
    from pagedllm.distributed.group import RankGroup

    llm = make_llm(tiny_llama_dir, 2)
    try:
        (worker,) = _workers(llm)

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(RankGroup, "reduce_logits", interrupted)
        with pytest.raises(KeyboardInterrupt):
            completions(llm, ["Hello"], GREEDY)
        monkeypatch.undo()
        assert llm.engine.failure is not None
        _assert_gone([worker], within=3)  # stopped with the failure, not left in a collective until shutdown()
        start = time.monotonic()
        with pytest.raises(WorkerFailedError):
            completions(llm, ["Hello again"], GREEDY)
        assert time.monotonic() - start < 5
    finally:
        llm.engine.shutdown()


def test_a_killed_worker_fails_the_next_request_at_once(tiny_llama_dir) -> None:
    llm = make_llm(tiny_llama_dir, 2)
    try:
        (worker,) = _workers(llm)
        completions(llm, ["Hello"], GREEDY)
        os.kill(worker, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerFailedError, match=rf"rank 1 \(pid {worker}\) exited with code -9"):
            completions(llm, ["Hello again"], GREEDY)
        assert time.monotonic() - start < 10
        with pytest.raises(WorkerFailedError):  # and every later step, without waiting again
            completions(llm, ["Hello"], GREEDY)
    finally:
        llm.engine.shutdown()
    _assert_gone([worker])


def test_a_killed_idle_worker_is_the_engines_failure_before_any_step(tiny_llama_dir) -> None:
    """engine.failure, which a server's health check reads, sees a dead worker without waiting for a step."""
    llm = make_llm(tiny_llama_dir, 2)
    try:
        (worker,) = _workers(llm)
        os.kill(worker, signal.SIGKILL)
        _assert_gone([worker])
        deadline = time.monotonic() + 5
        while llm.engine.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"rank 1 (pid {worker}) exited with code -9" in str(llm.engine.failure)
    finally:
        llm.engine.shutdown()


def test_shutdown_is_prompt_every_worker_exits_with_0_and_later_steps_say_so(tiny_llama_dir) -> None:
    llm = make_llm(tiny_llama_dir, 2)
    completions(llm, ["Hello"], GREEDY)
    workers = llm.engine.executor.workers
    start = time.monotonic()
    llm.engine.shutdown()
    assert time.monotonic() - start < 5
    assert [p.exitcode for p in workers.processes] == [0]
    with pytest.raises(WorkerFailedError, match="was shut down"):
        llm.engine.executor.execute([], [SeqInput([5], 0, [0])], [False])


RANK_0_SCRIPT = """
import sys, time
from pagedllm import LLM
if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], dtype="float32", num_blocks=64, block_size=4, tensor_parallel_size=2)
    print("PIDS", *llm.engine.executor.workers.pids, flush=True)
    time.sleep(120)
"""


def test_workers_exit_when_rank_0_is_killed(tiny_llama_dir, tmp_path) -> None:
    """SIGKILL on rank 0 runs no shutdown and no atexit: the workers notice on their own, well before the step
    timeout (60 s here) would end them."""
    import subprocess
    import sys

    script = tmp_path / "rank0.py"
    script.write_text(RANK_0_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PAGEDLLM_TP_TIMEOUT": "60"}
    rank_0 = subprocess.Popen([sys.executable, str(script), str(tiny_llama_dir)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    workers: list[int] = []
    try:
        line = next((line for line in rank_0.stdout if line.startswith("PIDS")), "")
        workers = [int(p) for p in line.split()[1:]]
        assert workers, "rank 0 never reported its workers"
        rank_0.kill()
        rank_0.wait(10)
        _assert_gone(workers, within=5)
    finally:
        rank_0.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_hung_worker_fails_the_request_within_the_timeout(tiny_llama_dir, monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_TP_TIMEOUT", "3")
    llm = make_llm(tiny_llama_dir, 2)
    try:
        (worker,) = _workers(llm)
        os.kill(worker, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(WorkerFailedError, match="a tensor-parallel rank failed"):
            completions(llm, ["Hello"], GREEDY)
        assert time.monotonic() - start < 15
    finally:
        llm.engine.shutdown()  # a stopped worker is killed
    _assert_gone([worker])


def test_idle_workers_outlive_the_timeout_on_heartbeats(tiny_llama_dir, monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_TP_TIMEOUT", "1.5")
    llm = make_llm(tiny_llama_dir, 2)
    try:
        workers = _workers(llm)
        first = completions(llm, ["Hello"], GREEDY)
        time.sleep(4.5)  # three timeouts with no step
        assert completions(llm, ["Hello"], GREEDY) == first
        assert all(alive(p) for p in workers)
    finally:
        llm.engine.shutdown()
    _assert_gone(workers)


def test_a_script_without_a_main_guard_fails_with_the_reason_instead_of_hanging(tiny_llama_dir, tmp_path) -> None:
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    script.write_text(
        "import sys\nfrom pagedllm import LLM\n"
        "LLM(model=sys.argv[1], dtype='float32', num_blocks=64, block_size=4, tensor_parallel_size=2)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), str(tiny_llama_dir)], env=env, capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr and "failed to start" in done.stderr


def test_a_join_that_fails_halfway_leaves_the_default_group(tiny_llama_dir, monkeypatch) -> None:
    """A worker lost after rank 0's default group formed fails the join: its group must go too, or the
    process could never start another engine ("a tensor-parallel engine is already running")."""
    import torch.distributed as dist

    from pagedllm.distributed.group import RankGroup

    def halfway(rank, size, store=None):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        raise RuntimeError("wait timeout after 60000ms")

    monkeypatch.setattr(RankGroup, "join", halfway)
    before = set(children(os.getpid()))
    with pytest.raises(RuntimeError, match="wait timeout"):
        make_llm(tiny_llama_dir, 2)
    assert not dist.is_initialized()
    _assert_gone(sorted(set(children(os.getpid())) - before))


def test_the_ranks_pools_together_must_fit_the_machine(tiny_llama_dir, monkeypatch) -> None:
    """Each rank's pool fits the available memory alone, both together do not: refused before any worker starts."""
    from pagedllm.engine import pool_memory

    per_rank = 256 * 3 * 2 * 4 * 1 * 16 * 4  # 256 blocks x 3 layers x K, V x 4 slots x 1 KV head x 16 dims x 4 bytes
    monkeypatch.setattr(pool_memory, "available_bytes", lambda: per_rank * 3 // 2)
    before = set(children(os.getpid()))
    with pytest.raises(InvalidInputError, match="2 ranks' KV pools of 0.0 GiB does not fit"):
        make_llm(tiny_llama_dir, 2, num_blocks=256)
    assert set(children(os.getpid())) == before
    monkeypatch.setattr(pool_memory, "available_bytes", lambda: per_rank * 2)
    llm = make_llm(tiny_llama_dir, 2, num_blocks=256)  # exactly fits
    llm.engine.shutdown()
