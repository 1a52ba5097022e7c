"""The Triton attention kernels against the reference impl and the float64 dense oracle, float32, 1e-5."""

import pytest
import torch

from attn_helpers import dense_attention, make_batch
from kernel_helpers import batch_on
from pagedllm.attention import AttentionMetadata, paged_attention
from pagedllm.attention.triton import triton_attention

HEADS = [(4, 4), (9, 3), (8, 2)]  # query heads per KV head: 1, 3, 4


def check(specs: list[tuple[int, int]], heads: tuple[int, int], block_size: int, device: torch.device,
          split_len: int | None = None, seed: int = 0, head_dim: int = 16) -> None:
    batch = make_batch(specs, *heads, block_size, head_dim=head_dim, seed=seed)
    on_device = batch_on(batch, device)
    out = triton_attention(on_device.query, on_device.kv_cache, on_device.meta, batch.scale, split_len=split_len)
    reference = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl="reference")
    torch.testing.assert_close(out.cpu(), reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.cpu().double(), dense_attention(batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_decode_ragged_lengths(heads: tuple[int, int], block_size: int, device: torch.device) -> None:
    check([(0, 1), (16, 1), (40, 1), (70, 1)], heads, block_size, device, seed=block_size + heads[0])


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("split_len", [5, 16, 24, 48])
def test_decode_splits_cut_blocks(block_size: int, split_len: int, device: torch.device) -> None:
    # 70 keys: the last split and the last block are partial; split boundaries inside blocks for 5 and 24;
    # the 3-key sequence leaves most splits unwritten, which the merge must ignore.
    check([(69, 1), (2, 1), (47, 1)], (9, 3), block_size, device, split_len=split_len, seed=split_len)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_prefill_with_cached_prefixes(heads: tuple[int, int], block_size: int, device: torch.device) -> None:
    # fresh prompts, chunked prefill after a cached part (on and off block boundaries), a 2-token chunk
    check([(0, 23), (33, 9), (32, 16), (5, 2)], heads, block_size, device, seed=block_size * 3 + heads[1])


@pytest.mark.parametrize("heads", HEADS)
def test_mixed_batch(heads: tuple[int, int], device: torch.device) -> None:
    check([(20, 1), (0, 19), (45, 1), (17, 6), (0, 1)], heads, 16, device, split_len=16, seed=heads[0])


def test_sizes_not_powers_of_two(device: torch.device) -> None:
    # blocks of 12 and head_dim 24: positions split across blocks by division, head_dim padded to 32 and masked
    check([(30, 1), (0, 14), (13, 11), (5, 1)], (6, 2), 12, device, split_len=20, seed=12, head_dim=24)


def test_prompt_longer_than_one_query_tile(device: torch.device) -> None:
    check([(3, 70)], (4, 1), 16, device, seed=5)  # 4 query heads per KV head: 16 tokens per tile


def test_plan_is_reused_across_layers(device: torch.device) -> None:
    batch = batch_on(make_batch([(10, 1), (0, 5)], 4, 2, 16, seed=2), device)
    first = triton_attention(batch.query, batch.kv_cache, batch.meta, batch.scale)
    plan = batch.meta.plan
    second = triton_attention(batch.query, batch.kv_cache, batch.meta, batch.scale)
    assert batch.meta.plan is plan
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_default_model_shapes(device: torch.device) -> None:
    """SmolLM2-135M's attention shapes (9 query heads, 3 KV heads, head_dim 64, blocks of 16). On CUDA the
    contexts are long enough for the default split choice to split the decode sequences; the interpreter
    runs short ones (one split)."""
    longest = 3000 if device.type == "cuda" else 150
    specs = [(longest - 1, 1), (longest // 3, 1), (7, 1), (longest // 2, 37), (0, 50)]
    batch = make_batch(specs, 9, 3, 16, head_dim=64, seed=9)
    on_device = batch_on(batch, device)
    out = triton_attention(on_device.query, on_device.kv_cache, on_device.meta, batch.scale)
    reference = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl="reference")
    torch.testing.assert_close(out.cpu(), reference, rtol=1e-5, atol=1e-5)
    if device.type == "cuda":
        assert on_device.meta.plan.num_splits > 1


def test_bfloat16_close_to_dense(device: torch.device) -> None:
    batch = make_batch([(40, 1), (0, 21), (17, 5)], 9, 3, 16, head_dim=64, dtype=torch.bfloat16, seed=11)
    on_device = batch_on(batch, device)
    out = triton_attention(on_device.query, on_device.kv_cache, on_device.meta, batch.scale, split_len=16)
    assert out.dtype == torch.bfloat16 and out.shape == batch.query.shape
    torch.testing.assert_close(out.cpu().double(), dense_attention(batch), rtol=2e-2, atol=2e-2)


def test_work_lists_route_by_query_length() -> None:
    from pagedllm.attention.triton.attention import work_lists

    decode, rows, tile_seq, tile_start = work_lists([1, 5, 0, 1, 2], block_m=2)
    assert (decode, rows) == ([0, 3], [0, 6])
    assert (tile_seq, tile_start) == ([1, 1, 1, 4], [0, 2, 4, 0])


def test_query_as_a_strided_view(device: torch.device) -> None:
    """The model's query is a view of a fused projection: rows further apart than heads * head_dim."""
    batch = make_batch([(12, 1), (3, 9)], 9, 3, 16, seed=4)
    fused = torch.cat([batch.query, torch.randn(batch.query.shape[0], 6, 16)], dim=1)  # [T, 9 + 2*3, d]
    on_device = batch_on(batch, device)
    query = fused.to(device)[:, :9]
    out = triton_attention(query, on_device.kv_cache, on_device.meta, batch.scale)
    reference = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl="reference")
    torch.testing.assert_close(out.cpu(), reference, rtol=1e-5, atol=1e-5)


def test_empty_batch(device: torch.device) -> None:
    batch = batch_on(make_batch([(4, 1)], 4, 2, 16), device)
    meta = AttentionMetadata.build([], [], [], 16, device=device)
    out = triton_attention(batch.query[:0], batch.kv_cache, meta, batch.scale)
    assert out.shape == (0, 4, 16)
