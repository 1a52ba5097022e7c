"""The conditions of a benchmark run, recorded with every result."""

import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_isa() -> list[str]:
    """The vector-instruction flags that decide the kernels' and dtype's paths, as the CPU reports them."""
    from pagedllm.kernels import cpu_flags

    present = set(cpu_flags())
    return [flag for flag in ISA_FLAGS if flag in present]


def git_commit() -> str | None:
    """The repository's HEAD (with '-dirty' when the tree has changes), or None outside a checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = _git(root, "rev-parse", "--short=12", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True,
                          timeout=10).stdout.strip()  # fmt: skip


def environment() -> dict:
    import torch

    import pagedllm

    return {
        "pagedllm_version": pagedllm.__version__,
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_model": cpu_model(),
        "cpu_isa": cpu_isa(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
