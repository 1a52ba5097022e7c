import random

import pytest
import torch

from attn_helpers import dense_attention, make_batch
from pagedllm.attention import paged_attention
from pagedllm.attention.blockwise import blockwise_attention
from pagedllm.errors import InvalidInputError

IMPLS = ["reference", "blockwise", "auto"]
HEADS = [(4, 4), (9, 3), (8, 2), (4, 1)]  # query/KV ratio 1, 3, 4 and MQA


def mixed_specs(seed: int, max_len: int = 300) -> list[tuple[int, int]]:
    """(num_cached, query_len): fresh prompts, chunked prefill after a cached part, decodes; ragged."""
    rng = random.Random(seed)
    specs = [(0, rng.randint(2, max_len)), (rng.randint(1, max_len), rng.randint(2, 40)), (0, 1)]
    specs += [(rng.randint(1, max_len), 1) for _ in range(4)]
    rng.shuffle(specs)
    return specs


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("block_size", [1, 2, 4, 16, 32])
def test_mixed_batch_matches_dense(impl: str, heads: tuple[int, int], block_size: int) -> None:
    seed = block_size * 10 + heads[0]
    batch = make_batch(mixed_specs(seed), *heads, block_size, seed=seed)
    out = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl=impl)
    torch.testing.assert_close(out.double(), dense_attention(batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "specs",
    [
        [(0, 1)],  # a one-token prompt
        [(0, 257)],  # one prompt, no cache: the SDPA is_causal path
        [(100, 1), (31, 1), (500, 1)],  # decode only
        [(64, 64), (63, 2)],  # chunked prefill on a block boundary and just before one
        [(0, 5), (0, 17), (0, 3)],  # several prompts
    ],
)
def test_special_batches_match_dense(impl: str, specs: list[tuple[int, int]]) -> None:
    batch = make_batch(specs, 9, 3, 16, seed=len(specs))
    out = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl=impl)
    torch.testing.assert_close(out.double(), dense_attention(batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks_per_part", [1, 3, 8])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_blockwise_any_part_size_matches_dense(blocks_per_part: int, block_size: int) -> None:
    batch = make_batch(mixed_specs(7, max_len=120), 8, 2, block_size, seed=block_size)
    out = blockwise_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, blocks_per_part)
    torch.testing.assert_close(out.double(), dense_attention(batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_bfloat16_close_to_dense(impl: str) -> None:
    batch = make_batch(mixed_specs(11), 9, 3, 16, head_dim=64, dtype=torch.bfloat16, seed=11)
    out = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl=impl)
    assert out.dtype == torch.bfloat16 and out.shape == batch.query.shape
    torch.testing.assert_close(out.double(), dense_attention(batch), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("impl", ["blockwise", "auto"])
def test_head_dim_64_float32_agrees_with_reference(impl: str) -> None:
    batch = make_batch(mixed_specs(5, max_len=400), 9, 3, 16, head_dim=64, seed=5)
    ref = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl="reference")
    out = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl=impl)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_unknown_impl_is_rejected() -> None:
    batch = make_batch([(0, 2)], 2, 1, 4)
    with pytest.raises(ValueError, match="unknown attention impl"):
        paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl="nope")


@pytest.mark.parametrize("impl", IMPLS + ["fast"])
def test_query_heads_that_do_not_fit_the_pool_are_refused(impl: str) -> None:
    batch = make_batch([(3, 2)], 4, 2, 4)
    for query in (batch.query[:, :3], batch.query[..., :8]):  # 3 heads over 2 KV heads; head_dim 8 against 16
        with pytest.raises(InvalidInputError, match="do not fit a KV pool"):
            paged_attention(query, batch.kv_cache, batch.meta, batch.scale, impl=impl)
    strided = torch.zeros(*batch.kv_cache.shape[:-1], 32)[..., ::2]
    with pytest.raises(InvalidInputError, match="head_dim must be contiguous"):
        paged_attention(batch.query, strided, batch.meta, batch.scale, impl=impl)


def test_auto_decode_in_many_small_chunks_matches_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    import pagedllm.attention.fast as fast

    monkeypatch.setattr(fast, "GATHER_BUDGET_BYTES", 4096)  # forces chunks of one or two sequences
    specs = [(n, 1) for n in (5, 90, 17, 33, 64, 3, 120)] + [(10, 6)]
    batch = make_batch(specs, 9, 3, 4, seed=2)
    assert len(fast.decode_chunks(batch.meta, list(range(7)), batch.kv_cache)) > 3
    out = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl="auto")
    torch.testing.assert_close(out.double(), dense_attention(batch), rtol=1e-5, atol=1e-5)
