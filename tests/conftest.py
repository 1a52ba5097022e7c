"""Shared fixtures. Tests never touch the network: the HF hub is forced offline here."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tiny test models are 50x slower with intra-op threads on a shared 2-core box (spinning workers);
# set before torch is first imported. Override with OMP_NUM_THREADS=N.
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent / "model"))  # so tests can `import tiny`


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF directory (config.json, model.safetensors, tokenizer with a ChatML chat template) of a random
    3-layer Llama: hidden 64, 4 query heads, 2 KV heads, vocab 384, bos 1, eos 2. Load with
    pagedllm.model.loader.load_model(path) / pagedllm.model.tokenizer.load_tokenizer(path)."""
    from tiny import save_tiny_dir

    return save_tiny_dir(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The cached default GGUF; tests using it must be marked @pytest.mark.slow."""
    from pagedllm.model.default_model import default_model_path as path

    if not path().is_file():
        pytest.skip("default model not cached; run `pagedllm fetch-default-model`")
    return path()
