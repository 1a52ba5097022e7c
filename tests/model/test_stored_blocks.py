"""Quantized blocks kept beside the dequantized weights: they dequantize as GGUF does, and where the AMX matmul
streams their tiles (small batches) it gives the same bits as over the bfloat16 panels."""

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
from pagedllm.model.stored_blocks import StoredBlocks, stack_blocks

needs_amx = pytest.mark.skipif(amx_matmul_kernels() is None, reason="no AMX matmul here (it needs a CPU with AMX-BF16)")
KINDS = {"q4_1": Q.Q4_1, "q8_0": Q.Q8_0}


def stored(kind: str, rows: int, inputs: int, seed: int = 0) -> tuple[StoredBlocks, torch.Tensor]:
    """Random weights stored as `kind`: their blocks and GGUF's float32 dequantization of them."""
    array = np.random.default_rng(seed).normal(0, 0.05, (rows, inputs)).astype(np.float32)
    raw = quantize(array, KINDS[kind])
    expected = torch.from_numpy(dequantize(raw, KINDS[kind]).reshape(rows, inputs))
    return StoredBlocks.from_gguf(raw, kind, rows, inputs), expected


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_dequantize_as_gguf_does(kind):
    blocks, expected = stored(kind, 24, 96)
    assert torch.equal(blocks.dequantized(), expected)
    assert (blocks.low is None) == (kind == "q8_0")


def test_blocks_follow_rows_taken_and_stacked():
    first, w1 = stored("q4_1", 8, 64, seed=1)
    second, w2 = stored("q4_1", 4, 64, seed=2)
    order = np.array([3, 0, 2, 1])
    assert torch.equal(second.take_rows(order).dequantized(), w2[order])
    assert torch.equal(stack_blocks([first, second]).dequantized(), torch.cat([w1, w2]))
    assert stack_blocks([first, None]) is None
    assert stack_blocks([first, stored("q8_0", 4, 64)[0]]) is None  # two kinds do not make one weight's tiles


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_gguf_blocks_are_the_weights_in_hf_row_order(tmp_path, qtype):
    hf = make_hf_model("llama")  # llama: llama.cpp's Q/K row reorder, undone for the blocks too
    path = write_gguf(hf, tmp_path / "m.gguf", qtype)
    _, state_dict, blocks = read_gguf_with_blocks(path)
    assert set(blocks) == {name for name, t in state_dict.items() if t.dim() == 2}
    for name, b in blocks.items():
        assert torch.equal(b.dequantized(), state_dict[name]), name
    assert read_gguf(path)[1].keys() == state_dict.keys()
    assert read_gguf_with_blocks(path, keep_blocks=False)[2] == {}


def test_the_blocks_are_kept_only_where_the_amx_matmul_would_stream_them(tmp_path, monkeypatch):
    import pagedllm.model.gguf_loader as gguf_loader
    from pagedllm.model import loader, projection

    path = write_gguf(make_hf_model("llama"), tmp_path / "m.gguf", Q.Q8_0)
    kept, read = [], gguf_loader.read_gguf_with_blocks
    monkeypatch.setattr(gguf_loader, "read_gguf_with_blocks", lambda p, keep_blocks: read(p, kept.append(keep_blocks)
                                                                                         or keep_blocks))
    monkeypatch.setattr(projection, "amx_matmul_kernels", lambda: None)  # a CPU without AMX
    for dtype in (torch.float32, torch.bfloat16):
        loader.load_model(path, dtype)
    assert kept == [False, False]
    monkeypatch.setattr(projection, "amx_matmul_kernels", lambda: object())  # with AMX: bfloat16 streams them
    assert [loader._blocks_stream(d, "cpu") for d in (torch.float32, torch.bfloat16)] == [False, True]


@needs_amx
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("out_features,in_features,gated", [(40, 64, False), (960, 576, False), (34, 96, True),
                                                             (3072, 576, True), (576, 1536, False)])  # fmt: skip
def test_amx_matmul_streaming_block_tiles_gives_the_same_bits(kind, out_features, in_features, gated):
    kernels = amx_matmul_kernels()
    blocks, weight = stored(kind, out_features, in_features, seed=out_features)
    weight = weight.to(torch.bfloat16)
    panels = kernels.pack_amx_linear(weight, gated=gated)
    tiles = kernels.pack_amx_blocks(blocks.scale, blocks.low, blocks.codes, gated=gated)
    assert kernels.amx_blocks_match(tiles, panels)
    outputs = out_features // 2 if gated else out_features
    bias = torch.randn(out_features).to(torch.bfloat16)
    for rows in (1, 5, 16, 17, 32, 33, 100, 256, 257):  # up to 256 rows stream the block tiles
        x = torch.randn(rows, in_features).to(torch.bfloat16)
        expected = kernels.amx_linear(x, panels, bias, outputs, gated=gated)
        assert torch.equal(kernels.amx_linear(x, panels, bias, outputs, gated=gated, blocks=tiles), expected), rows
        floats = kernels.amx_linear(x, panels, bias, outputs, gated=gated, float_output=True, blocks=tiles)
        assert torch.equal(floats, expected.float()), rows


@needs_amx
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_head_streaming_block_tiles_picks_the_same(kind):
    kernels = amx_matmul_kernels()
    blocks, weight = stored(kind, 1000, 64, seed=3)
    weight = weight.to(torch.bfloat16)
    panels = kernels.pack_amx_linear(weight)
    tiles = kernels.pack_amx_blocks(blocks.scale, blocks.low, blocks.codes)
    x = torch.randn(20, 64).to(torch.bfloat16)
    picks, logprobs = kernels.amx_greedy_head(x, panels, None, 1000, blocks=tiles)
    expected_picks, expected_logprobs = kernels.amx_greedy_head(x, panels, None, 1000)
    assert torch.equal(picks, expected_picks)
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=1e-6)  # threads' shares sum in any order


@needs_amx
def test_blocks_that_do_not_give_the_weight_are_not_streamed():
    kernels = amx_matmul_kernels()
    blocks, weight = stored("q4_1", 48, 64)
    weight = weight.to(torch.bfloat16)
    assert AmxWeight(weight, None, kernels, blocks=blocks).streams_blocks
    other = weight.clone()
    other[7, 33] += 1.0  # one weight the blocks do not give
    assert not AmxWeight(other, None, kernels, blocks=blocks).streams_blocks
    tiles = kernels.pack_amx_blocks(blocks.scale, blocks.low, blocks.codes)
    tiles[1, 0, 100] ^= 1  # one code of the second panel's first tile
    assert not kernels.amx_blocks_match(tiles, kernels.pack_amx_linear(weight))
    with pytest.raises(RuntimeError, match="pack_amx_blocks"):
        kernels.amx_linear(torch.randn(2, 64).to(torch.bfloat16), kernels.pack_amx_linear(weight), None, 48,
                           blocks=tiles[:2])  # fmt: skip
    with pytest.raises(RuntimeError, match="uint8 with low"):
        kernels.pack_amx_blocks(blocks.scale, None, blocks.codes)  # Q4_1 codes without their low


@needs_amx
def test_decoder_stack_refuses_block_tiles_of_another_weight():
    kernels = amx_matmul_kernels()
    hidden, heads, kv_heads, head_dim = 64, 2, 1, 32

    def matmul(out: int, features: int, gated: bool = False, blocks_rows: int | None = None, amx: bool = True):
        blocks, weight = stored("q4_1", out, features)
        tiles = None
        if blocks_rows is not None:  # the tiles of a weight with blocks_rows rows
            other = stored("q4_1", blocks_rows, features)[0]
            tiles = kernels.pack_amx_blocks(other.scale, other.low, other.codes, gated=gated)
        weight = weight.to(torch.bfloat16)
        panels = kernels.pack_amx_linear(weight, gated=gated) if amx else kernels.pack_linear(weight, gated)
        return kernels.StackMatmul(panels, None, out // 2 if gated else out, amx=amx, gated=gated, blocks=tiles)

    def add_layer(out_projection) -> None:
        norm = torch.ones(hidden).to(torch.bfloat16)
        stack = kernels.DecoderStack(heads, kv_heads, head_dim, 1e-5, head_dim**-0.5)
        stack.add_layer(norm, norm, matmul((heads + 2 * kv_heads) * head_dim, hidden), out_projection,
                        matmul(2 * hidden, hidden, gated=True), matmul(hidden, hidden))  # fmt: skip

    add_layer(matmul(hidden, heads * head_dim, blocks_rows=hidden))  # its own weight's tiles: accepted
    with pytest.raises(RuntimeError, match="pack_amx_blocks"):
        add_layer(matmul(hidden, heads * head_dim, blocks_rows=2 * hidden))
    with pytest.raises(RuntimeError, match="for an AMX weight"):
        add_layer(matmul(hidden, heads * head_dim, blocks_rows=hidden, amx=False))


@needs_amx
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_quantized_gguf_model_streams_its_blocks_with_the_same_logits(tmp_path, qtype):
    hf = make_hf_model("llama", tie_word_embeddings=True)
    config, state_dict, blocks = read_gguf_with_blocks(write_gguf(hf, tmp_path / "m.gguf", qtype))
    streamed = build_model(config, dict(state_dict), torch.bfloat16, blocks=blocks)
    panels = build_model(config, dict(state_dict), torch.bfloat16)
    projections = [p._amx for layer in streamed.model.layers
                   for p in (layer.self_attn.qkv, layer.self_attn.out, layer.mlp.gate_up, layer.mlp.down)]  # fmt: skip
    assert all(p is not None and p.streams_blocks for p in projections + [streamed.head._amx])  # the head: tied
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
