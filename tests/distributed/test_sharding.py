"""Tensor-parallel arithmetic, without processes: which slice each rank holds, the step message, the swaps a
worker replays, and the greedy reduction of vocabulary-parallel logits."""

import pytest
import torch

from pagedllm.attention.kv_cache import allocate_kv_caches
from pagedllm.distributed.executor import MirroredSwapSpace
from pagedllm.distributed.group import _combine, _summarise
from pagedllm.distributed.message import Kind, StepMessage, SwapCall, SwapOp, decode, encode
from pagedllm.distributed.sharded_load import take_slice
from pagedllm.distributed.sharding import Shard, check_shardable, kv_head_range, local_config, slice_spec
from pagedllm.distributed.worker import apply_swap
from pagedllm.engine.model_runner import SeqInput
from pagedllm.engine.sampler import SamplingRow
from pagedllm.engine.step_logits import StepLogits, greedy_only
from pagedllm.engine.swap import SwapSpace
from pagedllm.errors import InvalidInputError
from pagedllm.model.config import ModelConfig
from pagedllm.sampling_params import SamplingParams


def config(heads: int = 9, kv_heads: int = 3, vocab: int = 100, width: int = 48, head_dim: int = 4) -> ModelConfig:
    return ModelConfig("llama", vocab, heads * head_dim, width, 2, heads, kv_heads, head_dim)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "width", "size", "message"),
    [
        (9, 3, 48, 2, "cannot split 9 query heads over 2 ranks"),
        (6, 3, 48, 2, "cannot split 3 KV heads over 2 ranks"),
        (12, 4, 48, 6, "cannot split 4 KV heads over 6 ranks"),
        (4, 2, 50, 4, "cannot split an MLP of width 50 over 4 ranks"),
    ],
)
def test_a_shape_that_cannot_be_split_names_its_numbers(heads, kv_heads, width, size, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        check_shardable(config(heads, kv_heads, width=width), size)


def test_local_config_of_the_default_models_shape_over_three_ranks() -> None:
    local = local_config(config(9, 3, vocab=49152, width=1536, head_dim=64), 3)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.vocab_size) == (3, 1, 512, 16384)
    assert local.hidden_size == 576 and local.head_dim == 64


def _weights(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    q, kv, h = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size
    shapes = {
        "model.embed_tokens.weight": (cfg.vocab_size, h), "lm_head.weight": (cfg.vocab_size, h),
        "model.layers.0.self_attn.q_proj.weight": (q, h), "model.layers.0.self_attn.q_proj.bias": (q,),
        "model.layers.0.self_attn.k_proj.weight": (kv, h), "model.layers.0.self_attn.v_proj.weight": (kv, h),
        "model.layers.0.self_attn.o_proj.weight": (h, q),
        "model.layers.0.mlp.gate_proj.weight": (cfg.intermediate_size, h),
        "model.layers.0.mlp.up_proj.weight": (cfg.intermediate_size, h),
        "model.layers.0.mlp.down_proj.weight": (h, cfg.intermediate_size),
        "model.layers.0.input_layernorm.weight": (h,),
    }  # fmt: skip
    return {name: torch.randn(shape) for name, shape in shapes.items()}


@pytest.mark.parametrize(("heads", "kv_heads", "size"), [(4, 2, 2), (9, 3, 3), (6, 6, 3), (6, 6, 2)])
def test_the_ranks_slices_put_together_give_back_every_weight(heads, kv_heads, size) -> None:
    cfg = config(heads, kv_heads, vocab=101)  # 101 tokens: the last rank's vocabulary slice is padded
    local = local_config(cfg, size)
    for name, whole in _weights(cfg).items():
        parts = [take_slice(whole, slice_spec(name, cfg, Shard(r, size))) for r in range(size)]
        spec = slice_spec(name, cfg, Shard(0, size))
        if spec is None:
            assert all(torch.equal(p, whole) for p in parts), name
            continue
        if "embed_tokens" in name or "lm_head" in name:
            assert all(p.shape == (local.vocab_size, cfg.hidden_size) for p in parts)
        joined = torch.cat(parts, dim=spec.dim).narrow(spec.dim, 0, whole.shape[spec.dim])
        assert torch.equal(joined, whole), name
        assert torch.count_nonzero(torch.cat(parts, dim=spec.dim).narrow(spec.dim, whole.shape[spec.dim],
                                   len(parts) * spec.padded_len - whole.shape[spec.dim])) == 0  # fmt: skip


def test_kv_heads_are_replicated_when_there_are_more_ranks_than_kv_heads() -> None:
    cfg = config(heads=8, kv_heads=2, head_dim=4)
    assert [kv_head_range(cfg, Shard(r, 4)) for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    # each rank's query heads (2 of 8) belong to the KV head it holds: group of 4 query heads per KV head
    for rank in range(4):
        first_query_head = rank * 2
        assert kv_head_range(cfg, Shard(rank, 4))[0] == first_query_head // 4
    k = torch.randn(2 * 4, 32)
    assert torch.equal(take_slice(k, slice_spec("m.layers.0.self_attn.k_proj.weight", cfg, Shard(3, 4))), k[4:8])


def test_the_step_message_round_trips() -> None:
    msg = StepMessage(
        Kind.STEP,
        copies=[(3, 9), (4, 10)],
        swaps=[SwapCall(SwapOp.SAVE, 7, [1, 2, 3], 40), SwapCall(SwapOp.RESTORE, 8, [5]), SwapCall(SwapOp.DROP, 2)],
        seqs=[SeqInput([5, 6, 7], 0, [1], True, range(0, 2)), SeqInput([9], 33, [4, 8, 2], False),
              SeqInput([1], 0, [0])],
        greedy_rows=[True, False, False, False],
    )
    assert decode(encode(msg)) == msg
    assert decode(encode(StepMessage(Kind.HEARTBEAT))) == StepMessage(Kind.HEARTBEAT)
    with pytest.raises(ValueError, match="ends early"):
        decode(encode(msg)[:-1])


def test_a_step_message_with_words_past_its_end_is_refused() -> None:
    with pytest.raises(ValueError, match="past its end"):
        decode(encode(StepMessage(Kind.HEARTBEAT)) + [0])


def test_rank_0s_swaps_replayed_on_a_worker_leave_it_in_the_same_state() -> None:
    """Every save, restore and drop rank 0 makes reaches the workers as made (a block list the scheduler changes
    afterwards does not change what was sent), and a worker that applies them holds what rank 0 holds: nothing,
    once the swapped-out sequences were restored or dropped."""

    def pool() -> list[torch.Tensor]:
        torch.manual_seed(0)
        return [torch.randn(c.shape) for c in allocate_kv_caches(2, 8, 4, 1, 4, torch.float32)]

    rank_0, worker = MirroredSwapSpace(SwapSpace(pool())), SwapSpace(pool())
    blocks = [1, 2]
    rank_0.save(7, blocks, 6)
    blocks[:] = [5]  # the scheduler reuses its list
    rank_0.save(8, [3], 2)
    rank_0.restore(7, [4, 6])
    rank_0.drop(8)
    sent = decode(encode(StepMessage(Kind.STEP, swaps=rank_0.take_pending())))
    assert [(c.op.name, c.seq_id, c.blocks, c.num_tokens) for c in sent.swaps] == [
        ("SAVE", 7, [1, 2], 6), ("SAVE", 8, [3], 2), ("RESTORE", 7, [4, 6], 0), ("DROP", 8, [], 0)]  # fmt: skip
    for call in sent.swaps:
        apply_swap(worker, call)
    assert len(worker) == len(rank_0) == 0
    for a, b in zip(rank_0.local.kv_caches, worker.kv_caches):
        assert torch.equal(a, b)
    assert rank_0.take_pending() == []


def test_greedy_summaries_give_the_whole_rows_argmax_and_logprob() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 30)
    logits[1, 4] = logits[1, 17] = 9.0  # a tie across two ranks' slices: the lower id wins, as in argmax
    logits[2, 11] = logits[2, 12] = 9.0  # a tie inside one slice
    slices = [(0, 10), (10, 20), (20, 30)]
    picks = _combine([_summarise(logits[:, a:b], a) for a, b in slices])
    log_probs = logits.log_softmax(dim=-1)
    for row, pick in enumerate(picks):
        assert pick.token_id == int(logits[row].argmax())
        assert pick.logprob == pytest.approx(float(log_probs[row, pick.token_id]), abs=1e-5)


def test_rows_reduced_to_their_greedy_pick_are_never_read_whole() -> None:
    full = torch.randn(1, 8)
    logits = StepLogits(full, [-1, 0], {})
    assert torch.equal(logits.rows([1]), full)
    with pytest.raises(ValueError, match="greedy pick"):
        logits.rows([0])


@pytest.mark.parametrize(
    ("params", "outputs", "expected"),
    [
        (SamplingParams(temperature=0.0), [], True),
        (SamplingParams(temperature=0.7), [], False),
        (SamplingParams(temperature=0.0, logprobs=2), [], False),
        (SamplingParams(temperature=0.0, repetition_penalty=1.2), [], False),
        (SamplingParams(temperature=0.0, min_tokens=2), [5], False),  # stop tokens still masked
        (SamplingParams(temperature=0.0, min_tokens=2), [5, 6], True),
    ],
)
def test_which_rows_need_only_their_greedy_pick(params, outputs, expected) -> None:
    assert greedy_only(SamplingRow(params, None, [1, 2], outputs)) is expected
