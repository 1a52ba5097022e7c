"""The KV write and block copy kernels against kv_cache.write_kv / copy_blocks."""

import pytest
import torch

from pagedllm.attention import allocate_kv_caches, copy_blocks, write_kv
from pagedllm.attention.triton import triton_copy_blocks, triton_write_kv
from pagedllm.attention.triton.loader import check_device


def random_pools(num_layers: int, num_blocks: int, block_size: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    caches = allocate_kv_caches(num_layers, num_blocks, block_size, 3, 16, torch.float32)
    return [c.normal_(generator=gen) for c in caches]


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_write_kv_skips_minus_one(block_size: int, device: torch.device) -> None:
    gen = torch.Generator().manual_seed(block_size)
    cache = random_pools(1, 8, block_size, seed=1)[0]
    slots = torch.randperm(8 * block_size, generator=gen)[:7]
    slots[[1, 4]] = -1
    key, value = torch.randn(2, 7, 3, 16, generator=gen)
    expected = cache.clone()
    write_kv(key, value, expected, slots)
    on_device = cache.to(device)
    triton_write_kv(key.to(device), value.to(device), on_device, slots.to(device))
    assert torch.equal(on_device.cpu(), expected)


def test_write_kv_casts_to_cache_dtype(device: torch.device) -> None:
    # float32 -> bfloat16: GPUs round to nearest even like torch; the interpreter rounds toward zero,
    # so on the CPU the values may differ by one bfloat16 step (at most 2^-7 relative).
    gen = torch.Generator().manual_seed(3)
    cache = torch.zeros(2, 3, 4, 16, 16, dtype=torch.bfloat16)
    slots = torch.tensor([5, 17, 63])
    key, value = torch.randn(2, 3, 3, 16, generator=gen)
    expected = cache.clone()
    write_kv(key, value, expected, slots)
    on_device = cache.to(device)
    triton_write_kv(key.to(device), value.to(device), on_device, slots.to(device))
    step = 0.0 if device.type == "cuda" else 2**-7
    torch.testing.assert_close(on_device.cpu().float(), expected.float(), rtol=step, atol=0)
    assert torch.count_nonzero(on_device.cpu()) == torch.count_nonzero(expected)  # nothing written elsewhere


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_copy_on_write_every_layer(block_size: int, device: torch.device) -> None:
    caches = random_pools(2, 5, block_size, seed=block_size)
    copies = [(0, 3), (4, 1)]
    expected = [c.clone() for c in caches]
    copy_blocks(expected, copies)
    on_device = [c.to(device) for c in caches]
    triton_copy_blocks(on_device, copies)
    for got, want in zip(on_device, expected):
        assert torch.equal(got.cpu(), want)


def test_copy_between_pools(device: torch.device) -> None:
    src = [c.to(device) for c in random_pools(2, 5, 16, seed=7)]
    dst = [c.to(device) for c in random_pools(2, 3, 16, seed=8)]  # a smaller pool: block ids differ
    before = [d.clone() for d in dst]
    triton_copy_blocks(src, [(4, 0), (1, 2)], dst_caches=dst)
    for s, d, old in zip(src, dst, before):
        assert torch.equal(d[:, :, 0], s[:, :, 4]) and torch.equal(d[:, :, 2], s[:, :, 1])
        assert torch.equal(d[:, :, 1], old[:, :, 1])


def test_wrong_device_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CUDA tensors"):
        check_device(torch.zeros(1))
