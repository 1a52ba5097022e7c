"""The compiled paged-attention kernel (pagedllm/csrc/paged_attention.cpp) against the float64 dense oracle
and the torch reference: the issue's grid (GQA groups, head dims, block sizes, contexts up to 2048, mixed
batches, shared blocks, forced and automatic splits), bfloat16, strided queries and bad metadata."""

import random

import pytest
import torch

from attn_helpers import Batch, dense_attention, make_batch
from bf16_paths import ATTENTION_PATHS, attention_path
from compiled_kernels import require_compiled_kernels
from pagedllm.attention import AttentionMetadata, allocate_kv_caches, paged_attention, write_kv
from pagedllm.attention.compiled import compiled_attention

F32_TOL = dict(rtol=1e-5, atol=1e-5)
BF16_TOL = dict(rtol=1e-2, atol=1e-2)


@pytest.fixture(autouse=True, scope="module")
def require_kernels() -> None:
    require_compiled_kernels()


def mixed_specs(seed: int, max_cached: int = 300) -> list[tuple[int, int]]:
    """(num_cached, query_len): a prompt, a chunked prefill after a cached prefix, a one-token prompt, decodes."""
    rng = random.Random(seed)
    specs = [(0, rng.randint(2, 70)), (rng.randint(1, max_cached), rng.randint(2, 40)), (0, 1)]
    specs += [(rng.randint(1, max_cached), 1) for _ in range(3)]
    rng.shuffle(specs)
    return specs


def heads_for(group: int) -> tuple[int, int]:
    """(query heads, KV heads) with the given GQA group: two KV heads, so tiles of several heads are mixed."""
    return group * 2, 2


def check(batch: Batch, partition_size: int = 0, tol: dict = F32_TOL) -> torch.Tensor:
    out = compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, partition_size)
    assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
    torch.testing.assert_close(out.double(), dense_attention(batch), **tol)
    return out


@pytest.mark.parametrize("block_size", [1, 16, 32, 128])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_grid_mixed_batch_matches_dense_and_reference(group: int, head_dim: int, block_size: int) -> None:
    seed = group * 1000 + head_dim + block_size
    batch = make_batch(mixed_specs(seed), *heads_for(group), block_size, head_dim=head_dim, seed=seed)
    out = check(batch)
    ref = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl="reference")
    torch.testing.assert_close(out, ref, **F32_TOL)


@pytest.mark.parametrize("heads", [(5, 1), (7, 1), (16, 1), (64, 1)])
def test_odd_and_large_groups(heads: tuple[int, int]) -> None:
    """Groups that fill no vector evenly, and groups past the kernel's row target (one token per tile)."""
    check(make_batch(mixed_specs(heads[0]), *heads, 16, head_dim=64, seed=heads[0]), partition_size=40)


@pytest.mark.parametrize("head_dim", [16, 32])
def test_small_head_dims(head_dim: int) -> None:
    check(make_batch(mixed_specs(head_dim), 6, 2, 16, head_dim=head_dim, seed=head_dim))


@pytest.mark.parametrize(
    "specs,block_size",
    [
        ([(0, 1)], 16),  # the shortest context
        ([(1, 1), (15, 1), (16, 1), (17, 1), (31, 1), (32, 1)], 16),  # around block boundaries
        ([(126, 1), (127, 1), (128, 1), (129, 1)], 128),
        ([(2047, 1), (1000, 1), (5, 1)], 16),  # decodes up to 2048
        ([(2047, 1)], 1),
        ([(1900, 148)], 32),  # a chunk ending at 2048 over a long cached prefix
        ([(0, 2048)], 128),  # a 2048-token prompt
        ([(0, 1001), (333, 1)], 32),  # not multiples of the block
    ],
)
def test_context_lengths(specs: list[tuple[int, int]], block_size: int) -> None:
    batch = make_batch(specs, 4, 1, block_size, head_dim=64, seed=len(specs) + block_size)
    check(batch)


@pytest.mark.parametrize("partition_size", [1, 16, 48, 50])
@pytest.mark.parametrize("block_size", [16, 32])
def test_forced_split_matches_dense(partition_size: int, block_size: int) -> None:
    """48 is not a multiple of 32, 50 of neither block: parts start and end inside blocks, and the chunked
    prefill's early rows see no key at all in the later parts (m = -inf partials in the merge)."""
    seed = partition_size + block_size
    batch = make_batch(mixed_specs(seed, max_cached=500), 9, 3, block_size, head_dim=64, seed=seed)
    check(batch, partition_size)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("block_size", [16, 128])
def test_automatic_split_of_a_single_long_decode(threads: int, block_size: int) -> None:
    """One decode has fewer tiles than threads want, so the kernel splits its keys by itself and merges."""
    batch = make_batch([(2047, 1)], 8, 1, block_size, head_dim=128, seed=block_size)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = check(batch)
        unsplit = compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, partition_size=4096)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out, unsplit, **F32_TOL)


def test_result_does_not_depend_on_the_thread_count() -> None:
    batch = make_batch(mixed_specs(3, max_cached=1500), 8, 2, 16, head_dim=64, seed=3)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def shared_prefix_batch(block_size: int, seed: int = 0) -> Batch:
    """Four sequences over one pool. A, B and C point at the same two physical blocks for a common prefix;
    C is a fork of A that also shares A's partially filled third block; D shares nothing.
    A decodes, B runs a prefill chunk over the shared prefix, C decodes another token, D is a prompt."""
    gen = torch.Generator().manual_seed(seed)
    num_kv_heads, head_dim, num_blocks = 2, 64, 24
    cache = allocate_kv_caches(1, num_blocks, block_size, num_kv_heads, head_dim, torch.float32)[0]
    cache.normal_(generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    take = lambda tokens: [free.pop() for _ in range(-(-tokens // block_size))]  # noqa: E731
    rand = lambda n: torch.randn(n, num_kv_heads, head_dim, generator=gen)  # noqa: E731
    shared, a_rest = take(2 * block_size), take(block_size + 3)
    tables = [shared + a_rest, shared + take(block_size + 2), shared + a_rest[: -(-3 // block_size)], take(5)]
    prefix_k, prefix_v = rand(2 * block_size + 3), rand(2 * block_size + 3)
    tail_k, tail_v, b_k, b_v = rand(block_size), rand(block_size), rand(block_size + 2), rand(block_size + 2)
    keys = [torch.cat([prefix_k, tail_k]), torch.cat([prefix_k[: 2 * block_size], b_k]), prefix_k, rand(5)]
    values = [torch.cat([prefix_v, tail_v]), torch.cat([prefix_v[: 2 * block_size], b_v]), prefix_v, rand(5)]
    for table, k, v in zip(tables, keys, values):  # shared blocks are written more than once, same rows
        write_kv(k, v, cache, AttentionMetadata.build([table], [0], [len(k)], block_size).slot_mapping)
    query_lens = [1, block_size + 2, 1, 5]
    meta = AttentionMetadata.build(tables, [len(k) - q for k, q in zip(keys, query_lens)], query_lens, block_size)
    query = torch.randn(sum(query_lens), 3 * num_kv_heads, head_dim, generator=gen)
    return Batch(query, cache, meta, keys, values, head_dim**-0.5)


@pytest.mark.parametrize("partition_size", [0, 16])
@pytest.mark.parametrize("block_size", [1, 16])
def test_sequences_sharing_blocks(block_size: int, partition_size: int) -> None:
    batch = shared_prefix_batch(block_size, seed=block_size)
    tables = batch.meta.block_tables
    assert tables[0, :2].tolist() == tables[1, :2].tolist() == tables[2, :2].tolist()
    check(batch, partition_size)


def forked_batch(block_size: int, group: int, prefix_tokens: int, dtype: torch.dtype, seed: int) -> Batch:
    """Sequences whose tables start with the same physical blocks, as prefix caching and forks leave them:
    one family of 40 decodes over a common prefix (some with their own suffix, one that shares only the
    first half of the prefix), a short prefill chunk and a long one over it, a member with fewer cached
    keys than the prefix; a second family of two; and a sequence that shares nothing."""
    gen = torch.Generator().manual_seed(seed)
    num_kv_heads, head_dim = 2, 64
    prefix_blocks = max(1, prefix_tokens // block_size)
    rng = random.Random(seed)
    # (family, blocks of its prefix shared, own tokens after them, query_len)
    specs = [(0, prefix_blocks, rng.randint(1, 40), 1) for _ in range(40)]
    specs += [(0, prefix_blocks // 2, 30, 1), (0, prefix_blocks, 9, 5), (0, prefix_blocks, 70, 70)]
    specs += [(0, 1, 2, 1), (1, prefix_blocks, 3, 1), (1, prefix_blocks, 17, 1), (2, 0, 90, 1)]
    rng.shuffle(specs)
    own_blocks = [-(-own // block_size) for _, _, own, _ in specs]
    num_blocks = 2 * prefix_blocks + sum(own_blocks) + 1
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    family_blocks = [pool[:prefix_blocks], pool[prefix_blocks : 2 * prefix_blocks]]
    family_keys = [torch.randn(prefix_blocks * block_size, num_kv_heads, head_dim, generator=gen) for _ in range(2)]
    family_values = [torch.randn(prefix_blocks * block_size, num_kv_heads, head_dim, generator=gen) for _ in range(2)]
    at = 2 * prefix_blocks
    tables, keys, values = [], [], []
    for (family, shared, own, _), count in zip(specs, own_blocks):
        head = family_blocks[family][:shared] if family < 2 else []
        tables.append(head + pool[at : at + count])
        at += count
        shared_tokens = len(head) * block_size
        own_k = torch.randn(own, num_kv_heads, head_dim, generator=gen)
        own_v = torch.randn(own, num_kv_heads, head_dim, generator=gen)
        keys.append(torch.cat([family_keys[family % 2][:shared_tokens], own_k]).to(dtype))
        values.append(torch.cat([family_values[family % 2][:shared_tokens], own_v]).to(dtype))
    cache = allocate_kv_caches(1, num_blocks, block_size, num_kv_heads, head_dim, dtype)[0]
    cache.normal_(generator=gen)
    for table, k, v in zip(tables, keys, values):  # shared blocks are written once per sequence, same rows
        write_kv(k, v, cache, AttentionMetadata.build([table], [0], [len(k)], block_size).slot_mapping)
    query_lens = [q for *_, q in specs]
    meta = AttentionMetadata.build(tables, [len(k) - q for k, q in zip(keys, query_lens)], query_lens, block_size)
    query = torch.randn(sum(query_lens), group * num_kv_heads, head_dim, generator=gen).to(dtype)
    return Batch(query, cache, meta, keys, values, head_dim**-0.5)


@pytest.mark.parametrize("partition_size", [0, 16])
@pytest.mark.parametrize("prefix_tokens", [100, 1200])
@pytest.mark.parametrize("group,block_size", [(1, 1), (3, 16), (4, 32), (8, 128)])
def test_shared_prefix_attended_once_matches_dense(
    group: int, block_size: int, prefix_tokens: int, partition_size: int
) -> None:
    """Long common prefixes are attended once for all the sequences that hold them (more rows than one part
    takes, more keys than one piece), then merged with each sequence's own keys."""
    batch = forked_batch(block_size, group, prefix_tokens, torch.float32, seed=group + block_size + prefix_tokens)
    check(batch, partition_size)


@pytest.mark.parametrize("path", ATTENTION_PATHS)
@pytest.mark.parametrize("group,block_size", [(3, 16), (8, 32)])
def test_shared_prefix_bfloat16(group: int, block_size: int, path: str) -> None:
    with attention_path(path):
        check(forked_batch(block_size, group, 1100, torch.bfloat16, seed=group), tol=BF16_TOL)


def steepen(batch: Batch, rising: bool) -> Batch:
    """The batch's keys scaled by their position (0.2x to 6x over 500 positions, or back), written to the cache
    again: scores that climb or fall by tens over a sequence, so that rows' running maxima move far and often.
    Shared blocks get the same scale in every sequence that holds them."""
    for k in batch.keys:
        ramp = (torch.arange(len(k)) / 500).clamp(max=1) * 5.8
        ramp = 0.2 + ramp if rising else 6.0 - ramp
        k.copy_((k.float() * ramp[:, None, None]).to(k.dtype))
    return rewrite_cache(batch)


def rewrite_cache(batch: Batch) -> Batch:
    """The batch's keys and values, changed by a test, written to its cache again."""
    lens = [len(k) for k in batch.keys]
    full = AttentionMetadata.build(batch.meta.block_tables.tolist(), [0] * len(lens), lens, batch.kv_cache.shape[3])
    write_kv(torch.cat(batch.keys), torch.cat(batch.values), batch.kv_cache, full.slot_mapping)
    return batch


@pytest.mark.parametrize("path", ATTENTION_PATHS)
@pytest.mark.parametrize("rising", [True, False])
def test_bfloat16_scores_far_from_their_running_maximum(rising: bool, path: str) -> None:
    """On AMX tiles a row keeps its running max until a score passes it by 8 (no rescale pass over its outputs
    before that): prompts, decodes and a shared prefix whose scores move by far more than that."""
    prompts = make_batch([(0, 150), (200, 40), (300, 1), (90, 1)], 6, 2, 16, 64, torch.bfloat16, seed=5)
    with attention_path(path):
        check(steepen(prompts, rising), tol=BF16_TOL)
        check(steepen(forked_batch(16, 3, 400, torch.bfloat16, seed=6), rising), tol=BF16_TOL)


def scoring_far_below_zero(batch: Batch, depth: float) -> Batch:
    """Every query row and key moved along one direction, queries against keys, so that every score is about
    -depth. Softmax does not change under a shift, so the exact output is that of scores near 0; a running
    maximum that started at 0 instead of -inf would turn every exp(score - max) into 0 and divide by 0."""
    direction = torch.ones(batch.query.shape[-1]) / batch.query.shape[-1] ** 0.5
    shift = direction * (depth / batch.scale) ** 0.5
    for k in batch.keys:
        k.copy_((0.05 * k.float() + shift).to(k.dtype))
    batch.query = (0.05 * batch.query.float() - shift).to(batch.query.dtype)
    return rewrite_cache(batch)


@pytest.mark.parametrize("dtype,path", [(torch.float32, "widen"), (torch.bfloat16, "widen"), (torch.bfloat16, "dot")])
def test_scores_all_far_below_zero(dtype: torch.dtype, path: str) -> None:
    """A prompt (the many-row loop), decodes (the few-row loop) and a split decode, every score about -200."""
    batch = scoring_far_below_zero(make_batch([(0, 40), (90, 1), (300, 1), (20, 3)], 8, 2, 16, 64, dtype, seed=3),
                                   200.0)
    keys = batch.keys[1].double().repeat_interleave(4, 1)
    assert (torch.einsum("hd,khd->hk", batch.query[40].double(), keys) * batch.scale).max() < -150
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == torch.float32 else BF16_TOL  # scores of -200 lose float32 digits
    with attention_path(path):
        for partition_size in (0, 32):
            check(batch, partition_size, tol)


def test_split_whose_last_part_scores_far_above_the_others() -> None:
    """The merge rescales by the maximum over all parts (merge.py's rule): a last part whose scores stand about
    150 above the earlier parts' would otherwise be weighted by exp(150), past float32's range."""
    batch = make_batch([(99, 1), (70, 1)], 4, 1, 16, 64, torch.float32, seed=11)
    for query, keys, values in zip(batch.query, batch.keys, batch.values):
        direction = query[0] / query[0].norm()
        keys[-4:] = keys[-4:] * 0.01 + direction * (150 / batch.scale / query.norm(dim=-1).min())
        values[-4:] *= 4
    out = check(rewrite_cache(batch), partition_size=16, tol=dict(rtol=1e-4, atol=1e-4))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("query_len", [1, 3])
def test_odd_key_count_reads_nothing_left_by_an_earlier_call(query_len: int) -> None:
    """bfloat16 pair dot products over few rows pair an odd copy's last key with a zero probability and a value
    row that must be finite: the copy's own, never a row pointer an earlier call left in the thread's scratch
    (here one into a cache full of NaN, which 0 x NaN would carry into the output)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # both calls on one thread, so one scratch
    try:
        with attention_path("dot"):
            poisoned = make_batch([(64, 1), (200, 1)], 8, 2, 16, 64, torch.bfloat16, seed=12)
            poisoned.kv_cache.fill_(float("nan"))
            compiled_attention(poisoned.query, poisoned.kv_cache, poisoned.meta, poisoned.scale)
            batch = make_batch([(33 - query_len, query_len), (5 - query_len, query_len)], 8, 2, 16, 64,
                               torch.bfloat16, seed=13)
            assert torch.isfinite(check(batch, tol=BF16_TOL)).all()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype,path", [(torch.float32, "widen")] + [(torch.bfloat16, p) for p in ATTENTION_PATHS])
def test_nan_in_unused_slots_never_leaks(dtype: torch.dtype, path: str) -> None:
    """Slots past every sequence's length (tail of the last block, free blocks) hold NaN: a masked key that
    were multiplied by a zero probability would still poison the output (in bfloat16 with AVX512-BF16 too,
    where the last key of an odd tile is paired with a zero partner, not the next slot, and on AMX tiles,
    which multiply whole runs of keys)."""
    batch = make_batch(mixed_specs(21), 8, 2, 16, head_dim=64, dtype=dtype, seed=21)
    used = AttentionMetadata.build(
        batch.meta.block_tables.tolist(), [0] * batch.meta.num_seqs, batch.meta.seq_lens_list, 16
    ).slot_mapping
    flat = batch.kv_cache.view(2, 2, -1, 64)
    unused = torch.ones(flat.shape[2], dtype=torch.bool)
    unused[used] = False
    flat[:, :, unused] = float("nan")
    with attention_path(path):
        out = check(batch, tol=F32_TOL if dtype == torch.float32 else BF16_TOL)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("path", ATTENTION_PATHS)
@pytest.mark.parametrize("head_dim", [16, 32])
def test_bfloat16_small_head_dims(head_dim: int, path: str) -> None:
    """Head dims of one AMX tile depth (32) and below it (16: the many-row loops widen instead)."""
    batch = make_batch(mixed_specs(head_dim, max_cached=200), 9, 3, 16, head_dim, torch.bfloat16, head_dim)
    with attention_path(path):
        check(batch, tol=BF16_TOL)


@pytest.mark.parametrize("path", ATTENTION_PATHS)  # the many-row loops: vdpbf16ps, widened to float32, AMX
@pytest.mark.parametrize("partition_size", [0, 48])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group,block_size", [(1, 1), (3, 16), (4, 32), (8, 128)])
def test_bfloat16_cache(group: int, block_size: int, head_dim: int, partition_size: int, path: str) -> None:
    seed = group + block_size + head_dim
    batch = make_batch(
        mixed_specs(seed, max_cached=700), *heads_for(group), block_size, head_dim, torch.bfloat16, seed
    )
    with attention_path(path):
        check(batch, partition_size, BF16_TOL)


@pytest.mark.parametrize("path", ATTENTION_PATHS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group,query_len", [(1, 1), (3, 1), (4, 1), (1, 5), (3, 2), (1, 7)])
def test_bfloat16_few_rows(group: int, query_len: int, head_dim: int, path: str) -> None:
    """Tiles of 1-7 rows (decodes, short chunks): with pair dot products they score and accumulate values two
    keys at a time, 4 rows or fewer over the whole head, more a 32-dim slice at a time; contexts of odd lengths
    leave a last key without a partner."""
    specs = [(cached, query_len) for cached in (0, 6, 32, 63, 64, 200, 517)]
    batch = make_batch(specs, *heads_for(group), 16, head_dim, torch.bfloat16, seed=group * query_len + head_dim)
    with attention_path(path):
        check(batch, tol=BF16_TOL)


def test_bfloat16_agrees_with_reference() -> None:
    batch = make_batch(mixed_specs(8), 9, 3, 16, head_dim=64, dtype=torch.bfloat16, seed=8)
    out = compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale)
    ref = paged_attention(batch.query, batch.kv_cache, batch.meta, batch.scale, impl="reference")
    torch.testing.assert_close(out.float(), ref.float(), **BF16_TOL)


def test_strided_query_view_of_qkv() -> None:
    """The model passes q as a view into its fused qkv output: token rows further apart than heads * dim."""
    batch = make_batch(mixed_specs(4), 9, 3, 16, head_dim=64, seed=4)
    tokens, heads, dim = batch.query.shape
    qkv = torch.randn(tokens, (heads + 6) * dim)
    qkv[:, : heads * dim] = batch.query.reshape(tokens, -1)
    strided = qkv[:, : heads * dim].view(tokens, heads, dim)
    assert not strided.is_contiguous()
    out = compiled_attention(strided, batch.kv_cache, batch.meta, batch.scale)
    assert torch.equal(out, compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale))


def test_empty_batch() -> None:
    cache = allocate_kv_caches(1, 4, 16, 2, 64, torch.float32)[0]
    meta = AttentionMetadata.build([], [], [], 16)
    out = compiled_attention(torch.empty(0, 4, 64), cache, meta, 0.125)
    assert out.shape == (0, 4, 64)


def test_a_sequence_without_new_tokens_beside_one_sharing_its_blocks() -> None:
    """A row-less sequence (legal in the metadata) whose table starts with a decoding sequence's blocks: the
    shared-prefix pass must not take it as a member (it has no tiles to add its share to)."""
    torch.manual_seed(0)
    cache = torch.randn(2, 1, 16, 16, 64)
    tables, cached, new = [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 9], [10, 11, 12, 13, 14, 15]], [100, 79, 89], [0, 1, 1]
    for order in ([0, 1, 2], [1, 2, 0]):
        meta = AttentionMetadata.build([tables[i] for i in order], [cached[i] for i in order],
                                       [new[i] for i in order], 16)  # fmt: skip
        query = torch.randn(2, 4, 64)
        ref = paged_attention(query, cache, meta, 0.125, impl="reference")
        torch.testing.assert_close(compiled_attention(query, cache, meta, 0.125), ref, **F32_TOL)


def test_a_context_length_near_the_integer_limit_raises() -> None:
    batch = make_batch([(40, 1)], 4, 1, 16, head_dim=64)
    batch.meta.seq_lens[0] = 2**63 - 1
    with pytest.raises(ValueError, match="cannot hold 9223372036854775807"):
        compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale)


def test_zero_heads_or_block_size_raise() -> None:
    batch = make_batch([(10, 2)], 4, 2, 16, head_dim=64)
    with pytest.raises(RuntimeError, match="positive multiple of KV heads"):
        compiled_attention(batch.query[:, :0], batch.kv_cache, batch.meta, batch.scale)
    with pytest.raises(RuntimeError, match="positive multiple of KV heads"):
        compiled_attention(batch.query, batch.kv_cache[:, :0].contiguous(), batch.meta, batch.scale)
    with pytest.raises(RuntimeError, match="positive block size"):
        compiled_attention(batch.query, batch.kv_cache[:, :, :, :0].contiguous(), batch.meta, batch.scale)


def test_block_id_past_the_pool_raises() -> None:
    batch = make_batch([(40, 1)], 4, 1, 16, head_dim=64)
    batch.meta.block_tables[0, 1] = batch.kv_cache.shape[2]
    with pytest.raises(ValueError, match="outside the pool"):
        compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale)


@pytest.mark.parametrize("block_id", [-1, -(10**9)])
def test_negative_block_id_raises(block_id: int) -> None:
    batch = make_batch([(40, 1)], 4, 1, 16, head_dim=64, seed=1)
    batch.meta.block_tables[0, 1] = block_id
    with pytest.raises(ValueError, match="outside the pool"):
        compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale)


def test_fewer_query_rows_than_the_metadata_raises() -> None:
    batch = make_batch([(40, 3)], 4, 1, 16, head_dim=64, seed=1)
    with pytest.raises(ValueError, match="number of query rows"):
        compiled_attention(batch.query[:1], batch.kv_cache, batch.meta, batch.scale)


def test_context_shorter_than_its_new_tokens_raises() -> None:
    batch = make_batch([(0, 5)], 4, 1, 16, head_dim=64, seed=1)
    batch.meta.seq_lens[0] = 3
    with pytest.raises(ValueError, match="5 new tokens but a context of 3"):
        compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale)


def test_block_table_too_narrow_raises() -> None:
    batch = make_batch([(40, 1)], 4, 1, 16, head_dim=64)
    batch.meta.block_tables = batch.meta.block_tables[:, :2].contiguous()  # 32 positions for 41 tokens
    with pytest.raises(ValueError, match="cannot hold 41"):
        compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale)


def test_unsupported_head_dim_raises() -> None:
    batch = make_batch([(10, 2)], 4, 2, 16, head_dim=48)
    with pytest.raises(RuntimeError, match="head_dim 16, 32, 64 and 128"):
        compiled_attention(batch.query, batch.kv_cache, batch.meta, batch.scale)


def test_mismatched_dtypes_and_heads_raise() -> None:
    batch = make_batch([(10, 2)], 4, 2, 16, head_dim=64)
    with pytest.raises(RuntimeError, match="share one dtype"):
        compiled_attention(batch.query.bfloat16(), batch.kv_cache, batch.meta, batch.scale)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        compiled_attention(batch.query.half(), batch.kv_cache.half(), batch.meta, batch.scale)
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        compiled_attention(batch.query[:, :3], batch.kv_cache, batch.meta, batch.scale)
