"""The engine's executor: what runs a scheduled step's copies and model, and gives back its logits.

`LocalExecutor` is the one-process case, the runner itself. Under tensor parallelism the engine holds a
`pagedllm.distributed.executor.TensorParallelExecutor` with the same methods instead.
"""

from typing import Protocol

from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.engine.step_logits import StepLogits
from pagedllm.engine.swap import SwapSpace, SwapStore


class Executor(Protocol):
    runner: ModelRunner  # this process's runner (rank 0's under tensor parallelism)
    swap_space: SwapStore
    failure: BaseException | None  # set once the executor can never run another step

    def execute(self, copies: list[tuple[int, int]], seqs: list[SeqInput], greedy_rows: list[bool]) -> StepLogits:
        """Copy-on-write copies first, then the model over the step's tokens. `greedy_rows` marks the
        logits rows whose sampling needs only the greedy pick (an executor may reduce those)."""
        ...

    def shutdown(self) -> None: ...


class LocalExecutor:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.swap_space = SwapSpace(runner.kv_caches)
        self.failure = None

    def execute(self, copies: list[tuple[int, int]], seqs: list[SeqInput], greedy_rows: list[bool]) -> StepLogits:
        self.runner.copy_blocks(copies)
        if greedy_rows and all(greedy_rows):
            return self.runner.execute_greedy(seqs)
        return StepLogits.dense(self.runner.execute(seqs))

    def shutdown(self) -> None:
        pass
