"""The compiled KV write and block copy (pagedllm/csrc/cache_ops.cpp) against their torch counterparts,
on the strided views the model passes, and their bounds checks (a bad slot or block id raises)."""

import pytest
import torch
from compiled_kernels import require_compiled_kernels

from pagedllm.attention import allocate_kv_caches, copy_blocks, write_kv
from pagedllm.attention.compiled import compiled_copy_blocks, compiled_write_kv

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 6, 2, 64


@pytest.fixture(autouse=True, scope="module")
def require_kernels() -> None:
    require_compiled_kernels()


def noisy_cache(num_blocks: int, block_size: int, dtype: torch.dtype, seed: int = 0,
                head_dim: int = HEAD_DIM) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    cache = allocate_kv_caches(1, num_blocks, block_size, NUM_KV_HEADS, head_dim, dtype)[0]
    return cache.copy_(torch.randn(cache.shape, generator=gen))


def qkv_views(num_tokens: int, dtype: torch.dtype, seed: int = 1,
              head_dim: int = HEAD_DIM) -> tuple[torch.Tensor, torch.Tensor]:
    """key, value: [T, KVH, D] views into one [T, (H + 2 KVH) D] tensor, as the model's fused projection gives."""
    gen = torch.Generator().manual_seed(seed)
    q_size, kv_size = NUM_HEADS * head_dim, NUM_KV_HEADS * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=gen).to(dtype)
    _, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return k.view(num_tokens, NUM_KV_HEADS, head_dim), v.view(num_tokens, NUM_KV_HEADS, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("head_dim", [HEAD_DIM, 40, 7])  # rows of whole 32-byte vectors, and with a rest
def test_write_kv_equals_torch_on_strided_views(block_size: int, dtype: torch.dtype, head_dim: int) -> None:
    num_blocks, num_tokens = 80 // block_size + 2, 70
    key, value = qkv_views(num_tokens, dtype, head_dim=head_dim)
    assert not key.is_contiguous() and not value.is_contiguous()
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(2))[:num_tokens]
    slots[::7] = -1  # tokens whose K/V must not be stored (e.g. already cached)
    expected = noisy_cache(num_blocks, block_size, dtype, head_dim=head_dim)
    got = noisy_cache(num_blocks, block_size, dtype, head_dim=head_dim)
    write_kv(key, value, expected, slots)
    compiled_write_kv(key, value, got, slots)
    assert torch.equal(got, expected)
    assert not torch.equal(got, noisy_cache(num_blocks, block_size, dtype, head_dim=head_dim))  # it wrote


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_with_key_and_value_strides_that_differ(dtype: torch.dtype) -> None:
    """A contiguous key (as an out-of-place rotary leaves it) beside a value still inside the fused qkv: each is
    read with its own token stride."""
    key, value = qkv_views(20, dtype)
    key = key.contiguous()
    assert key.stride(0) != value.stride(0)
    slots = torch.randperm(4 * 16, generator=torch.Generator().manual_seed(2))[:20]
    expected = noisy_cache(4, 16, dtype)
    got = expected.clone()
    write_kv(key, value, expected, slots)
    compiled_write_kv(key, value, got, slots)
    assert torch.equal(got, expected)


def test_write_kv_skips_every_minus_one_slot() -> None:
    cache = noisy_cache(4, 16, torch.float32)
    key, value = qkv_views(5, torch.float32)
    compiled_write_kv(key, value, cache, torch.full((5,), -1, dtype=torch.int64))
    compiled_write_kv(key[:0], value[:0], cache, torch.empty(0, dtype=torch.int64))
    assert torch.equal(cache, noisy_cache(4, 16, torch.float32))


def test_write_kv_slot_past_the_pool_raises_and_writes_nothing() -> None:
    cache = noisy_cache(4, 16, torch.float32)
    key, value = qkv_views(3, torch.float32)
    with pytest.raises(RuntimeError, match="slot out of range"):
        compiled_write_kv(key, value, cache, torch.tensor([0, 64, 5]))
    assert torch.equal(cache, noisy_cache(4, 16, torch.float32))


def test_write_kv_bad_arguments_raise() -> None:
    cache = noisy_cache(4, 16, torch.float32)
    key, value = qkv_views(3, torch.float32)
    slots = torch.tensor([0, 1, 2])
    with pytest.raises(RuntimeError, match="share one dtype"):
        compiled_write_kv(key.bfloat16(), value.bfloat16(), cache, slots)
    with pytest.raises(RuntimeError, match="one slot per token"):
        compiled_write_kv(key, value, cache, slots[:2])
    with pytest.raises(RuntimeError, match="int64"):
        compiled_write_kv(key, value, cache, slots.int())
    with pytest.raises(RuntimeError, match="does not match kv_cache"):
        compiled_write_kv(key[:, :1], value[:, :1], cache, slots)
    with pytest.raises(RuntimeError, match="contiguous heads"):
        compiled_write_kv(key.transpose(0, 1), value.transpose(0, 1), cache, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match=r"slot out of range \(-1 skips"):
        compiled_write_kv(key, value, cache, torch.tensor([0, -2, 2]))
    with pytest.raises(RuntimeError, match="1-D"):
        compiled_write_kv(key, value, cache, slots.view(3, 1))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        compiled_write_kv(key.double(), value.double(), cache.double(), slots)
    with pytest.raises(RuntimeError, match="positive block size"):
        compiled_write_kv(key, value, cache[:, :, :, :0].contiguous(), slots)
    assert torch.equal(cache, noisy_cache(4, 16, torch.float32))


def noisy_caches(num_layers: int, dtype: torch.dtype) -> list[torch.Tensor]:
    return [noisy_cache(10, 4, dtype, seed=layer) for layer in range(num_layers)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_blocks_equals_torch_in_every_layer(dtype: torch.dtype) -> None:
    copies = [(3, 7), (3, 0), (9, 2), (1, 5)]  # copy-on-write: one shared source may get several copies
    expected, got = noisy_caches(3, dtype), noisy_caches(3, dtype)
    copy_blocks(expected, copies)
    compiled_copy_blocks(got, copies)
    for layer, (e, g) in enumerate(zip(expected, got)):
        assert torch.equal(g, e), f"layer {layer}"
        assert torch.equal(g[:, :, 7], g[:, :, 3]) and torch.equal(g[:, :, 5], g[:, :, 1])


def test_copy_blocks_without_copies_changes_nothing() -> None:
    caches = noisy_caches(2, torch.float32)
    compiled_copy_blocks(caches, [])
    assert all(torch.equal(c, e) for c, e in zip(caches, noisy_caches(2, torch.float32)))


@pytest.mark.parametrize("copies", [[(0, 10)], [(10, 0)], [(-1, 3)], [(3, -1)]])
def test_copy_blocks_bad_block_id_raises_and_copies_nothing(copies: list[tuple[int, int]]) -> None:
    caches = noisy_caches(2, torch.float32)
    with pytest.raises(RuntimeError, match="block id out of range"):
        compiled_copy_blocks(caches, [(1, 2)] + copies)
    assert all(torch.equal(c, e) for c, e in zip(caches, noisy_caches(2, torch.float32)))
