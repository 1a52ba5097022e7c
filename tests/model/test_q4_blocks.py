"""Q4_1 blocks kept beside the dequantized weights: they dequantize as GGUF does, and where the AMX matmul streams
their 4-bit tiles (small batches) it gives the same bits as over the bfloat16 panels."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from gguf_writer import write_gguf
from tiny import make_hf_model

from pagedllm.attention import AttentionMetadata, allocate_kv_caches
from pagedllm.model.gguf_loader import read_gguf, read_gguf_with_blocks
from pagedllm.model.loader import build_model
from pagedllm.model.projection import AmxWeight, amx_matmul_kernels
from pagedllm.model.q4_blocks import Q4Blocks, stack_blocks

needs_amx = pytest.mark.skipif(amx_matmul_kernels() is None, reason="no AMX matmul here (it needs a CPU with AMX-BF16)")


def q4_1(rows: int, inputs: int, seed: int = 0) -> tuple[Q4Blocks, torch.Tensor]:
    """Random weights stored as Q4_1: their blocks and GGUF's float32 dequantization of them."""
    array = np.random.default_rng(seed).normal(0, 0.05, (rows, inputs)).astype(np.float32)
    raw = quantize(array, Q.Q4_1)
    return Q4Blocks.from_q4_1(raw, rows, inputs), torch.from_numpy(dequantize(raw, Q.Q4_1).reshape(rows, inputs))


def test_blocks_dequantize_as_gguf_does():
    blocks, expected = q4_1(24, 96)
    assert blocks.codes.dtype == torch.uint8 and int(blocks.codes.max()) <= 15
    assert torch.equal(blocks.dequantized(), expected)


def test_blocks_follow_rows_taken_and_stacked():
    first, w1 = q4_1(8, 64, seed=1)
    second, w2 = q4_1(4, 64, seed=2)
    order = np.array([3, 0, 2, 1])
    assert torch.equal(second.take_rows(order).dequantized(), w2[order])
    assert torch.equal(stack_blocks([first, second]).dequantized(), torch.cat([w1, w2]))
    assert stack_blocks([first, None]) is None


def test_gguf_blocks_are_the_weights_in_hf_row_order(tmp_path):
    hf = make_hf_model("llama")  # llama: llama.cpp's Q/K row reorder, undone for the blocks too
    path = write_gguf(hf, tmp_path / "q4.gguf", Q.Q4_1)
    _, state_dict, blocks = read_gguf_with_blocks(path)
    assert set(blocks) == {name for name, t in state_dict.items() if t.dim() == 2}
    for name, b in blocks.items():
        assert torch.equal(b.dequantized(), state_dict[name]), name
    assert read_gguf(path)[1].keys() == state_dict.keys()


@needs_amx
@pytest.mark.parametrize("out_features,in_features,gated", [(40, 64, False), (960, 576, False), (34, 96, True),
                                                             (3072, 576, True), (576, 1536, False)])  # fmt: skip
def test_amx_matmul_streaming_4_bit_tiles_gives_the_same_bits(out_features, in_features, gated):
    kernels = amx_matmul_kernels()
    blocks, weight = q4_1(out_features, in_features, seed=out_features)
    weight = weight.to(torch.bfloat16)
    panels = kernels.pack_amx_linear(weight, gated=gated)
    tiles = kernels.pack_amx_q4(blocks.scale, blocks.low, blocks.codes, gated=gated)
    assert kernels.amx_q4_matches(tiles, panels)
    outputs = out_features // 2 if gated else out_features
    bias = torch.randn(out_features).to(torch.bfloat16)
    for rows in (1, 5, 16, 17, 32, 33, 100, 128, 129):  # up to 128 rows stream the 4-bit tiles
        x = torch.randn(rows, in_features).to(torch.bfloat16)
        expected = kernels.amx_linear(x, panels, bias, outputs, gated=gated)
        assert torch.equal(kernels.amx_linear(x, panels, bias, outputs, gated=gated, q4=tiles), expected), rows
        floats = kernels.amx_linear(x, panels, bias, outputs, gated=gated, float_output=True, q4=tiles)
        assert torch.equal(floats, expected.float()), rows


@needs_amx
def test_blocks_that_do_not_give_the_weight_are_not_streamed():
    kernels = amx_matmul_kernels()
    blocks, weight = q4_1(48, 64)
    weight = weight.to(torch.bfloat16)
    assert AmxWeight(weight, None, kernels, q4=blocks).streams_q4
    other = weight.clone()
    other[7, 33] += 1.0  # one weight the blocks do not give
    assert not AmxWeight(other, None, kernels, q4=blocks).streams_q4
    tiles = kernels.pack_amx_q4(blocks.scale, blocks.low, blocks.codes)
    tiles[1, 0, 100] ^= 1  # one code of the second panel's first tile
    assert not kernels.amx_q4_matches(tiles, kernels.pack_amx_linear(weight))
    with pytest.raises(RuntimeError, match="pack_amx_q4"):
        kernels.amx_linear(torch.randn(2, 64).to(torch.bfloat16), kernels.pack_amx_linear(weight), None, 48,
                           q4=tiles[:2])  # fmt: skip


@needs_amx
def test_q4_gguf_model_streams_its_blocks_with_the_same_logits(tmp_path):
    hf = make_hf_model("llama")
    config, state_dict, blocks = read_gguf_with_blocks(write_gguf(hf, tmp_path / "q4.gguf", Q.Q4_1))
    streamed = build_model(config, dict(state_dict), torch.bfloat16, q4=blocks)
    panels = build_model(config, dict(state_dict), torch.bfloat16)
    projections = [p._amx for layer in streamed.model.layers
                   for p in (layer.self_attn.qkv, layer.self_attn.out, layer.mlp.gate_up, layer.mlp.down)]  # fmt: skip
    assert all(p is not None and p.streams_q4 for p in projections)
    assert streamed.stack is not None and streamed.stack.covers(40)  # the layers run in the decoder stack's call
    for tokens in (7, 40):  # a prompt's rows, then more rows than one pass of the matmul
        ids = torch.arange(3, 3 + tokens)
        assert torch.equal(_logits(streamed, ids), _logits(panels, ids)), tokens


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    cfg = model.config
    caches = allocate_kv_caches(cfg.num_layers, 16, 4, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
    meta = AttentionMetadata.build([list(range(16))], [0], [len(ids)], 4)
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(len(ids)), caches, meta))
