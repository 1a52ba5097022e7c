"""The conditions of a benchmark run, recorded with every result."""

import os
import platform
import subprocess
from pathlib import Path

from pagedllm.kernels import cpu_isa, cpuinfo


def cpu_model() -> str:
    return cpuinfo("model name") or platform.processor() or "unknown"


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
