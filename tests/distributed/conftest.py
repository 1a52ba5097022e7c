import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # so tests can `import tp_helpers`


@pytest.fixture(scope="session")
def tiny_tp3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama that splits over 3 ranks: 6 query heads, 3 KV heads of 16, MLP width 192."""
    from tiny import save_tiny_dir

    return save_tiny_dir(
        tmp_path_factory.mktemp("tiny_tp3"), seed=3, hidden_size=96, num_attention_heads=6, num_key_value_heads=3,
        intermediate_size=192,
    )


@pytest.fixture(scope="session")
def tiny_mqa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with one KV head: over 2 ranks the KV head is replicated."""
    from tiny import save_tiny_dir

    return save_tiny_dir(tmp_path_factory.mktemp("tiny_mqa"), seed=4, num_key_value_heads=1)
