"""The engine runs without triton: importing the attention package, the Triton entry points' modules and
the engine never imports triton (the kernels import it on first use)."""

import subprocess
import sys


def test_import_does_not_need_triton() -> None:
    code = (
        "import sys; import pagedllm, pagedllm.attention, pagedllm.attention.triton;"
        "import pagedllm.attention.triton.attention, pagedllm.attention.triton.ops;"
        "from pagedllm.attention.triton import triton_attention, triton_write_kv, triton_copy_blocks;"
        "print('triton' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
