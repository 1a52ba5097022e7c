"""load_tokenizer(path): from a local HF directory, or built from a GGUF file's vocabulary (cached)."""

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pagedllm.errors import ModelLoadError
from pagedllm.model.default_model import cache_dir

logger = logging.getLogger("pagedllm")


def load_tokenizer(path: str | Path) -> Any:
    """A transformers fast tokenizer with the model's chat template; never touches the network."""
    path = Path(path).expanduser()
    if path.is_dir():
        return _from_pretrained(path)
    if path.is_file():
        return _from_gguf_cached(path)
    raise ModelLoadError(f"tokenizer path {path} does not exist (expected an HF directory or a .gguf file)")


def gguf_tokenizer_cache_path(gguf: Path) -> Path:
    """Keyed by name, size and mtime: converting a GGUF vocabulary takes seconds, loading the result does not."""
    stat = gguf.stat()
    return cache_dir() / "tokenizers" / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"


def _from_gguf_cached(gguf: Path) -> Any:
    cached = gguf_tokenizer_cache_path(gguf)
    if cached.is_dir():
        try:
            # its tokenizer.json as saved: the class its config names may rebuild parts of its own (Qwen2's adds
            # an NFC normalizer, which transformers' GGUF tokenizer has not), and encode differently
            return _from_pretrained(cached, as_saved=True)
        except ModelLoadError as exc:  # a damaged entry is built again, not an error on every later load
            logger.warning("rebuilding the cached tokenizer %s (%s)", cached, exc)
            shutil.rmtree(cached, ignore_errors=True)
    tokenizer = _from_pretrained(gguf.parent, gguf_file=gguf.name)
    _save_atomically(tokenizer, cached)
    return tokenizer


def _save_atomically(tokenizer: Any, target: Path) -> None:
    """Write next to the target, then rename, so a concurrent reader never sees half a directory."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".partial-"))
    except OSError:
        return  # the cache is best effort
    try:
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _from_pretrained(path: Path, as_saved: bool = False, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    loader = PreTrainedTokenizerFast if as_saved else AutoTokenizer
    try:
        return loader.from_pretrained(path, local_files_only=True, **kwargs)
    except Exception as exc:  # transformers and huggingface_hub raise many kinds on bad or missing files
        where = path / kwargs["gguf_file"] if "gguf_file" in kwargs else path
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(f"cannot load a tokenizer from {where}: {reason}") from None
