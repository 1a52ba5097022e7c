"""The fused layer ops (pagedllm/csrc/layer_ops.cpp) against their torch counterparts, and the tiny model's
compiled path against the reference path through ModelRunner (logits per step, greedy tokens)."""

import pytest
import torch
import torch.nn.functional as F
from compiled_kernels import require_compiled_kernels
from greedy import greedy_paged
from tiny import save_tiny_dir

from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.model import compiled_ops
from pagedllm.model.config import ModelConfig
from pagedllm.model.layers import RMSNorm, RotaryEmbedding, apply_rotary
from pagedllm.model.loader import load_model

BF16_TOL = dict(rtol=1.6e-2, atol=2e-2)


@pytest.fixture(autouse=True, scope="module")
def require_kernels() -> None:
    require_compiled_kernels()


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- add_rms_norm -------------------------------------------------------------------------------------------


def rms_norm_module(width: int, dtype: torch.dtype) -> RMSNorm:
    norm = RMSNorm(width, eps=1e-5).to(dtype)
    norm.weight.data = (1 + 0.5 * randn(width, seed=9)).to(dtype)
    return norm


@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("width", [64, 100, 576])
def test_add_rms_norm_float32_equals_residual_add_then_rmsnorm(rows: int, width: int) -> None:
    norm = rms_norm_module(width, torch.float32)
    hidden, residual = randn(rows, width, seed=1), randn(rows, width, seed=2) * 3
    expected_residual = residual + hidden
    expected = norm(expected_residual)
    compiled_ops.add_rms_norm(hidden, residual, norm.weight.data, norm.eps)
    torch.testing.assert_close(residual, expected_residual, rtol=0, atol=0)
    torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("width", [576, 100, 36])  # whole vectors; vectors and a tail (AVX-512 and AVX2)
@pytest.mark.parametrize("add_residual", [True, False])
def test_add_rms_norm_bfloat16(width: int, add_residual: bool) -> None:
    """Rounded as transformers' RMSNorm rounds: x * rsqrt(mean + eps) to bfloat16, then times the weight. A kernel
    that rounds once differs in about a quarter of the elements, each within BF16_TOL, so they are counted."""
    norm = rms_norm_module(width, torch.bfloat16)
    hidden, residual = randn(9, width, dtype=torch.bfloat16, seed=1), randn(9, width, dtype=torch.bfloat16, seed=2)
    expected_residual = residual + hidden if add_residual else hidden.clone()
    expected = norm(expected_residual)
    compiled_ops.kernels().add_rms_norm(hidden, residual if add_residual else None, norm.weight.data, norm.eps)
    if add_residual:
        assert torch.equal(residual, expected_residual)  # one rounding of the exact sum, as torch does
    torch.testing.assert_close(hidden.float(), expected.float(), **BF16_TOL)
    assert (hidden != expected).float().mean() <= 0.01


def test_add_rms_norm_on_strided_rows_leaves_the_rest_alone() -> None:
    norm = rms_norm_module(64, torch.float32)
    wide_hidden, wide_residual = randn(5, 96, seed=3), randn(5, 80, seed=4)
    hidden, residual = wide_hidden[:, :64], wide_residual[:, 16:]
    expected_residual = residual + hidden
    expected = norm(expected_residual)
    compiled_ops.add_rms_norm(hidden, residual, norm.weight.data, norm.eps)
    torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(residual, expected_residual, rtol=0, atol=0)
    assert torch.equal(wide_hidden[:, 64:], randn(5, 96, seed=3)[:, 64:])
    assert torch.equal(wide_residual[:, :16], randn(5, 80, seed=4)[:, :16])


def test_rms_norm_without_residual() -> None:
    norm = rms_norm_module(64, torch.float32)
    x = randn(4, 64, seed=5)
    expected = norm(x)
    compiled_ops.kernels().add_rms_norm(x, None, norm.weight.data, norm.eps)
    torch.testing.assert_close(x, expected, rtol=1e-5, atol=1e-6)


def test_add_rms_norm_bad_arguments_raise() -> None:
    x, residual, weight = randn(3, 64), randn(3, 64), torch.ones(64)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        compiled_ops.add_rms_norm(x.double(), residual.double(), weight.double(), 1e-5)
    with pytest.raises(RuntimeError, match="weight \\[width\\]"):
        compiled_ops.add_rms_norm(x, residual, torch.ones(32), 1e-5)
    with pytest.raises(RuntimeError, match="weight \\[width\\] of x's dtype"):
        compiled_ops.add_rms_norm(x, residual, weight.bfloat16(), 1e-5)
    with pytest.raises(RuntimeError, match="residual must match x"):
        compiled_ops.add_rms_norm(x, residual[:2], weight, 1e-5)
    with pytest.raises(RuntimeError, match="contiguous rows"):
        compiled_ops.add_rms_norm(x.t(), residual.t(), torch.ones(3), 1e-5)


# -- head_rms_norm (Qwen3's q and k norms) ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [36, 64, 128])  # 36: vectors and a tail (AVX-512 and AVX2)
def test_head_rms_norm_on_qkv_views_equals_the_module_on_each_head(head_dim: int, dtype: torch.dtype) -> None:
    heads, kv_heads, tokens = 3, 1, 7
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=head_dim) * 3
    original = qkv.clone()
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    q_norm, k_norm = rms_norm_module(head_dim, dtype), rms_norm_module(head_dim, dtype)
    k_norm.weight.data = k_norm.weight.data.flip(0)
    expected_q, expected_k = q_norm(q), k_norm(k)
    compiled_ops.head_rms_norm(q, q_norm.weight.data, q_norm.eps)
    compiled_ops.head_rms_norm(k, k_norm.weight.data, k_norm.eps)
    if dtype == torch.float32:
        torch.testing.assert_close(q, expected_q, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(k, expected_k, rtol=1e-5, atol=1e-6)
    else:  # rounded as the module rounds (see test_add_rms_norm_bfloat16)
        for ours, theirs in ((q, expected_q), (k, expected_k)):
            torch.testing.assert_close(ours.float(), theirs.float(), **BF16_TOL)
            assert (ours != theirs).float().mean() <= 0.01
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], original[:, (heads + kv_heads) * head_dim :])


def test_head_rms_norm_bad_arguments_raise() -> None:
    x = randn(4, 2, 16)
    with pytest.raises(RuntimeError, match="weight must be \\[head_dim\\] of x's dtype"):
        compiled_ops.head_rms_norm(x, torch.ones(8), 1e-6)
    with pytest.raises(RuntimeError, match="weight must be \\[head_dim\\] of x's dtype"):
        compiled_ops.head_rms_norm(x, torch.ones(16, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(RuntimeError, match="contiguous heads"):
        compiled_ops.head_rms_norm(x.transpose(0, 1), torch.ones(16), 1e-6)


# -- rotary -------------------------------------------------------------------------------------------------


def cos_sin(positions: list[int], head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    config = ModelConfig("llama", vocab_size=8, hidden_size=head_dim * 2, intermediate_size=8, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=head_dim)  # fmt: skip
    return RotaryEmbedding(config).cos_sin(torch.tensor(positions), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_rotary_in_place_on_qkv_views_equals_apply_rotary(head_dim: int, dtype: torch.dtype) -> None:
    heads, kv_heads, positions = 3, 1, [0, 1, 7, 100, 2047, 5]
    tokens = len(positions)
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=head_dim)
    original = qkv.clone()
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    cos, sin = cos_sin(positions, head_dim, dtype)
    expected_q, expected_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    compiled_ops.rotary(q, cos, sin)
    compiled_ops.rotary(k, cos, sin)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else BF16_TOL
    torch.testing.assert_close(q, expected_q, **tol)
    torch.testing.assert_close(k, expected_k, **tol)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], original[:, (heads + kv_heads) * head_dim :])


def test_rotary_bad_arguments_raise() -> None:
    x = randn(4, 2, 16)
    cos, sin = cos_sin([0, 1, 2, 3], 16, torch.float32)
    with pytest.raises(RuntimeError, match="contiguous \\[tokens, head_dim\\] of x's dtype"):
        compiled_ops.rotary(x, cos.bfloat16(), sin.bfloat16())
    with pytest.raises(RuntimeError, match="contiguous \\[tokens, head_dim\\]"):
        compiled_ops.rotary(x, cos[:3], sin[:3])
    with pytest.raises(RuntimeError, match="contiguous heads"):
        compiled_ops.rotary(x.transpose(0, 1), cos, sin)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        compiled_ops.rotary(x.half(), cos.half(), sin.half())


# -- silu_mul -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 37, 128, 1536])  # 37: 16-lane vectors and a tail
def test_silu_mul_equals_torch(width: int, dtype: torch.dtype) -> None:
    gate_up = randn(7, 2 * width, dtype=dtype, seed=width) * 4
    gate_up[0, 0], gate_up[-1, 0] = -100.0, 100.0  # far tails of the sigmoid
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    out = compiled_ops.silu_mul(gate_up)
    assert out.shape == (7, width) and out.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else BF16_TOL
    torch.testing.assert_close(out, expected, **tol)


def test_silu_mul_accepts_a_non_contiguous_input() -> None:
    gate_up = randn(32, 10, seed=3).t()  # [10, 32], column-major
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(compiled_ops.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-6)


def test_silu_mul_bad_arguments_raise() -> None:
    with pytest.raises(RuntimeError, match="\\[rows, 2 \\* width\\]"):
        compiled_ops.silu_mul(randn(3, 7))
    with pytest.raises(RuntimeError, match="\\[rows, 2 \\* width\\]"):
        compiled_ops.silu_mul(randn(3, 2, 4))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        compiled_ops.silu_mul(randn(3, 8).double())


# -- the model through ModelRunner --------------------------------------------------------------------------

# (model type, config overrides): the conftest's shape (head_dim 16, group 2), and SmolLM2's head shape
# (head_dim 64, group 3) with qkv bias
MODELS = {"llama_d16_gqa2": ("llama", {}),
          "qwen2_d64_gqa3": ("qwen2", {"hidden_size": 192, "num_attention_heads": 3, "num_key_value_heads": 1})}  # fmt: skip


@pytest.fixture(scope="module", params=list(MODELS))
def tiny_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    model_type, overrides = MODELS[request.param]
    return load_model(save_tiny_dir(tmp_path_factory.mktemp(request.param), model_type, **overrides))


def runner(tiny_model, impl: str, block_size: int) -> ModelRunner:
    model, config = tiny_model
    return ModelRunner(model, config, num_blocks=64, block_size=block_size, dtype=torch.float32, attention_impl=impl)


def run_steps(r: ModelRunner, steps: list[list[SeqInput]]) -> list[torch.Tensor]:
    return [r.execute(step) for step in steps]


@pytest.mark.parametrize("block_size", [1, 16])
def test_compiled_logits_match_reference(tiny_model, block_size: int) -> None:
    """Step 1: prompt A whole + the first chunk of prompt B; step 2: the rest of B + A's first decode;
    then decodes of both (teacher-forced with the same tokens, so both runners see identical inputs)."""
    a, b = [5, 17, 200, 33, 9, 100, 101, 7, 8, 9, 10], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56]
    blocks = -(-24 // block_size)
    table_a, table_b = [63 - 2 * i for i in range(blocks)], [2 * i for i in range(blocks)]  # disjoint, scattered
    steps = [[SeqInput(a, 0, table_a), SeqInput(b[:6], 0, table_b, needs_logits=False)],
             [SeqInput([42], len(a), table_a), SeqInput(b[6:], 6, table_b)]]  # fmt: skip
    for i in range(5):
        steps.append([SeqInput([100 + i], len(a) + 1 + i, table_a), SeqInput([200 + i], len(b) + i, table_b)])
    compiled, reference = runner(tiny_model, "compiled", block_size), runner(tiny_model, "reference", block_size)
    assert compiled.attention_impl == "compiled"
    for got, expected in zip(run_steps(compiled, steps), run_steps(reference, steps), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_compiled_greedy_tokens_match_reference(tiny_model) -> None:
    prompts = [[5, 17, 200, 33, 9, 100, 101], [3], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57]]
    compiled, reference = runner(tiny_model, "compiled", 4), runner(tiny_model, "reference", 4)
    assert greedy_paged(compiled, prompts, 24) == greedy_paged(reference, prompts, 24)


def test_compiled_copy_on_write_continues_like_the_original(tiny_model) -> None:
    r = runner(tiny_model, "compiled", 4)
    prompt = [5, 17, 200, 33, 9, 100]  # block 10 full, block 11 holds 2 tokens
    r.execute([SeqInput(prompt, 0, [10, 11])])
    r.copy_blocks([(11, 20)])
    original = r.execute([SeqInput([42], 6, [10, 11])])
    forked = r.execute([SeqInput([42], 6, [10, 20])])
    assert torch.equal(forked, original)
