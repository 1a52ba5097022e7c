"""Shared pieces of the tensor-parallel tests: engines on tiny models, and finding a process's children."""

from pathlib import Path

from pagedllm import LLM, SamplingParams

ENGINE_OPTIONS = dict(dtype="float32", num_blocks=256, block_size=4, max_num_batched_tokens=4096)


def make_llm(model: Path, size: int, **options) -> LLM:
    return LLM(model=str(model), tensor_parallel_size=size, **{**ENGINE_OPTIONS, **options})


def completions(llm: LLM, prompts, params: SamplingParams) -> list[list[tuple[list[int], float]]]:
    """Per prompt, per completion: its token ids and cumulative logprob."""
    return [[(c.token_ids, c.cumulative_logprob) for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]


def same_completions(a, b, logprob_tol: float = 1e-3) -> bool:
    if [[ids for ids, _ in req] for req in a] != [[ids for ids, _ in req] for req in b]:
        return False
    return all(abs(x - y) <= logprob_tol for ra, rb in zip(a, b) for (_, x), (_, y) in zip(ra, rb))


def children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (from /proc), but multiprocessing's resource tracker, which the
    first spawn starts and which lives as long as the process."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:  # the process ended while we looked
            continue
        if int(fields.get("PPid", "0")) != pid or fields.get("State", "").startswith("Z"):
            continue
        cmdline = (status.parent / "cmdline").read_bytes() if (status.parent / "cmdline").exists() else b""
        if b"resource_tracker" not in cmdline:
            found.append(int(status.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
