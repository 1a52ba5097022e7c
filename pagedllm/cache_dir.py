"""Where pagedllm keeps what it downloads or builds once per machine."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """$PAGEDLLM_CACHE_DIR, else $XDG_CACHE_HOME/pagedllm (~/.cache/pagedllm)."""
    if "PAGEDLLM_CACHE_DIR" in os.environ:
        return Path(os.environ["PAGEDLLM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pagedllm"
