"""What can be checked of the CUDA-graph module without a GPU (the padded replay itself is checked against
the eager step in tests/attention/triton_kernels/test_triton_engine.py, on CUDA there with real graphs)."""

import pytest
import torch

from pagedllm.engine.cuda_graphs import DecodeGraphs, padded_sizes
from pagedllm.engine.model_runner import ModelRunner


@pytest.mark.parametrize("max_num_seqs, sizes", [
    (1, [1]), (3, [1, 2, 4]), (8, [1, 2, 4, 8]), (9, [1, 2, 4, 8, 16]), (64, [1, 2, 4] + list(range(8, 65, 8))),
])
def test_padded_sizes_end_at_the_first_that_holds_max_num_seqs(max_num_seqs, sizes):
    assert padded_sizes(max_num_seqs) == sizes


def test_graphs_are_refused_off_cuda_or_off_triton(tiny_llama_dir):
    from pagedllm.model.loader import load_model

    model, config = load_model(tiny_llama_dir, torch.float32, "cpu")
    runner = ModelRunner(model, config, 8, 4, torch.float32, "reference", "cpu")
    with pytest.raises(ValueError, match="need the runner on CUDA with the Triton attention"):
        DecodeGraphs(runner, 4, 16)
    with pytest.raises(ValueError, match="need the runner on CUDA with the Triton attention"):
        DecodeGraphs(runner, 4, 16, capture=False)
