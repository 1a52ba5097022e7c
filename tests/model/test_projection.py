"""The packed projections (pagedllm's own matmul, oneDNN) are the same matmul as torch's linear, and the gated
one (an MLP's gate/up with silu(gate) * up applied as the matmul stores) the same as linear then the activation."""

import pytest
import torch
import torch.nn.functional as F

import pagedllm.model.projection as projection
from bf16_paths import BF16_PATHS, bf16_matmul_path
from pagedllm.model.layers import silu_mul
from pagedllm.model.projection import GatedProjection, Projection, amx_matmul_kernels, can_pack, linear_kernels

@pytest.fixture(autouse=True)
def own_bf16_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    """pagedllm's AVX512-BF16 matmul for bfloat16, so that it is tested on a CPU with AMX too (where the AMX
    matmuls take its place); the AMX tests below turn them back on."""
    monkeypatch.setattr(projection, "amx_matmul_kernels", lambda: None)


needs_linear_kernel = pytest.mark.skipif(linear_kernels(torch.float32) is None,
                                         reason="no compiled linear kernel here (it needs AVX-512 or AVX2 and a compiler)")


def check_projection(rows: int, out_features: int, in_features: int, bias: bool) -> Projection:
    torch.manual_seed(rows * 7 + out_features)
    x = torch.randn(rows, in_features)
    weight = torch.randn(out_features, in_features)
    b = torch.randn(out_features) if bias else None
    expected = F.linear(x.double(), weight.double(), None if b is None else b.double())
    proj = Projection(weight, b, pack=True)
    got = proj(x)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)
    return proj


@pytest.mark.skipif(not can_pack(torch.float32), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("rows,out_features,in_features,bias", [(1, 64, 32, False), (37, 1728, 576, True), (300, 96, 160, False)])
def test_onednn_projection_equals_linear(monkeypatch: pytest.MonkeyPatch, rows, out_features, in_features, bias):
    monkeypatch.setattr(projection, "linear_kernels", lambda dtype: None)
    assert check_projection(rows, out_features, in_features, bias)._kernels is None


@needs_linear_kernel
@pytest.mark.parametrize("rows", [1, 3, 6, 8, 9, 64, 513, 1100])  # tiles of 8 (AVX-512) or 6 rows, passes of 512
# panels of 48 (AVX-512) or 16 columns: partial, whole and one-past panels of either
@pytest.mark.parametrize("out_features,in_features", [(1, 5), (15, 9), (16, 64), (47, 64), (48, 577), (49, 33),
                                                      (1000, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_kernel_equals_linear(rows, out_features, in_features, bias):
    assert check_projection(rows, out_features, in_features, bias)._kernels is not None


@needs_linear_kernel
@pytest.mark.parametrize("rows", [129, 131, 383, 641])  # passes cut into blocks of unequal sizes
def test_linear_kernel_covers_every_row_of_uneven_blocks(rows):
    check_projection(rows, 50, 40, bias=True)


@needs_linear_kernel
def test_linear_kernel_takes_strided_rows_and_no_rows():
    torch.manual_seed(0)
    weight = torch.randn(50, 40)
    proj = Projection(weight, None, pack=True)
    wide = torch.randn(6, 80)
    torch.testing.assert_close(proj(wide[:, ::2]), F.linear(wide[:, ::2], weight), rtol=1e-5, atol=1e-5)
    assert proj(torch.empty(0, 40)).shape == (0, 50)


@needs_linear_kernel
def test_linear_kernel_rejects_mismatched_inputs():
    kernels = linear_kernels(torch.float32)
    panels = kernels.pack_linear(torch.randn(50, 40))
    with pytest.raises(RuntimeError, match="features"):
        kernels.linear(torch.randn(3, 41), panels, None, 50)
    with pytest.raises(RuntimeError, match="pack_linear"):
        kernels.linear(torch.randn(3, 40), panels, None, 200)
    with pytest.raises(RuntimeError, match="bias"):
        kernels.linear(torch.randn(3, 40), panels, torch.randn(49), 50)
    with pytest.raises(RuntimeError, match="dtype"):
        kernels.linear(torch.randn(3, 40, dtype=torch.bfloat16), panels, None, 50)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernels.pack_linear(torch.randn(50, 40, dtype=torch.float64))


needs_bf16_linear_kernel = pytest.mark.skipif(linear_kernels(torch.bfloat16) is None,
                                              reason="no bfloat16 linear kernel here (it needs AVX512-BF16)")


@needs_bf16_linear_kernel
def test_bf16_matmul_path_is_measured_or_asked_for():
    kernels = linear_kernels(torch.bfloat16)
    assert kernels.bf16_matmul_path() in BF16_PATHS  # "auto": the faster one on this core, timed once
    with pytest.raises(RuntimeError, match="'auto', 'dot' or 'widen'"):
        kernels.set_bf16_matmul_path("fast")
    assert kernels.bf16_matmul_path() in BF16_PATHS


@needs_bf16_linear_kernel
@pytest.mark.parametrize("rows", [1, 9, 513])
@pytest.mark.parametrize("out_features,in_features", [(1, 2), (47, 64), (49, 34), (1000, 576)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("path", BF16_PATHS)
def test_bf16_linear_kernel_equals_linear(path, rows, out_features, in_features, bias):
    torch.manual_seed(rows + out_features)
    x = torch.randn(rows, in_features, dtype=torch.bfloat16)
    weight = torch.randn(out_features, in_features, dtype=torch.bfloat16)
    b = torch.randn(out_features, dtype=torch.bfloat16) if bias else None
    proj = Projection(weight, b, pack=True)
    with bf16_matmul_path(path):
        got = proj(x)
    assert proj._kernels is not None and got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    # float32 sums of the exact bf16 products, rounded once to bfloat16 (half an ulp: 2^-9 relative)
    expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
    torch.testing.assert_close(got.float(), expected, rtol=2**-8, atol=1e-3)


@needs_bf16_linear_kernel
def test_bf16_weight_with_odd_inputs_stays_on_onednn():
    torch.manual_seed(0)
    weight, x = torch.randn(20, 33, dtype=torch.bfloat16), torch.randn(5, 33, dtype=torch.bfloat16)
    proj = Projection(weight, None, pack=True)
    assert proj._kernels is None and proj._packed is not None
    torch.testing.assert_close(proj(x).float(), F.linear(x, weight).float(), rtol=1e-2, atol=1e-2)


needs_amx = pytest.mark.skipif(amx_matmul_kernels() is None, reason="no AMX matmul here (it needs a CPU with AMX-BF16)")


@needs_amx
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 33, 64, 100])  # tiles of 16 rows, passes of 32
@pytest.mark.parametrize("out_features,in_features", [(1, 32), (16, 64), (40, 96), (1000, 576), (576, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_amx_linear_kernel_equals_linear(rows, out_features, in_features, bias):
    """Panels of 16 outputs taken two at a time: one partial panel, one whole, an odd count with a partial last."""
    kernels = amx_matmul_kernels()
    torch.manual_seed(rows + out_features)
    x = torch.randn(rows, in_features, dtype=torch.bfloat16)
    weight = torch.randn(out_features, in_features, dtype=torch.bfloat16)
    b = torch.randn(out_features, dtype=torch.bfloat16) if bias else None
    got = kernels.amx_linear(x, kernels.pack_amx_linear(weight), b, out_features)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
    torch.testing.assert_close(got.float(), expected, rtol=2**-8, atol=1e-3)


@needs_amx
@pytest.mark.parametrize("rows", [1, 5, 17, 33, 100])
@pytest.mark.parametrize("intermediate,in_features", [(8, 32), (16, 64), (40, 96), (1536, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_amx_linear_kernel_equals_linear_then_silu_mul(rows, intermediate, in_features, bias):
    """A gate panel and its up panel per 16 outputs: one partial pair, one whole, two whole and a partial."""
    kernels = amx_matmul_kernels()
    torch.manual_seed(rows + intermediate)
    x = torch.randn(rows, in_features, dtype=torch.bfloat16)
    weight = (torch.randn(2 * intermediate, in_features) / in_features**0.5).to(torch.bfloat16)
    b = torch.randn(2 * intermediate, dtype=torch.bfloat16) if bias else None
    tiles = kernels.pack_amx_linear(weight, gated=True)
    got = kernels.amx_linear(x, tiles, b, intermediate, gated=True)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, intermediate)
    torch.testing.assert_close(got.double(), gated_reference(x, weight, b), rtol=2**-8, atol=2e-3)


@needs_amx
@pytest.mark.parametrize("rows", [1, 17, projection.AMX_OWN_MAX_ROWS, projection.AMX_OWN_MAX_ROWS + 1])
def test_float_outputs_are_the_bfloat16_results_widened(monkeypatch: pytest.MonkeyPatch, rows):
    """The LM head's logits: the AMX matmul stores float32 values of its bfloat16 results, exactly what .float() of
    the bfloat16 output gives (oneDNN's larger batches convert after the matmul)."""
    monkeypatch.setattr(projection, "amx_matmul_kernels", amx_matmul_kernels)  # the AMX matmuls back on
    torch.manual_seed(rows)
    weight, bias = torch.randn(40, 64, dtype=torch.bfloat16), torch.randn(40, dtype=torch.bfloat16)
    proj, x = Projection(weight, bias, pack=True), torch.randn(rows, 64, dtype=torch.bfloat16)
    got = proj.float_outputs(x)
    assert got.dtype == torch.float32 and torch.equal(got, proj(x).float())


def greedy_heads() -> list:
    """The LM heads with a greedy pass: pagedllm's own matmul (float32; bfloat16 with AVX512-BF16) and AMX's."""
    own = [pytest.param(dtype, False, id=f"own-{dtype}".replace("torch.", ""))
           for dtype in (torch.float32, torch.bfloat16) if linear_kernels(dtype) is not None]
    return own + [pytest.param(torch.bfloat16, True, id="amx", marks=needs_amx)]


@pytest.mark.parametrize("dtype,amx", greedy_heads())
@pytest.mark.parametrize("rows", [1, 5, 32, 33, projection.AMX_OWN_MAX_ROWS])
@pytest.mark.parametrize("vocab,bias", [(40, True), (1000, False), (4099, False)])
def test_greedy_picks_are_the_argmax_and_logprob_of_the_logits(monkeypatch: pytest.MonkeyPatch, dtype, amx, rows,
                                                               vocab, bias):
    """The LM head's greedy pass: per row the first argmax of the logits it would have stored and that logit's
    log-probability, with ties (columns of equal weights) in every row and vocabularies no multiple of 16."""
    if amx:
        monkeypatch.setattr(projection, "amx_matmul_kernels", amx_matmul_kernels)  # the AMX matmuls back on
    torch.manual_seed(rows + vocab)
    weight, x = torch.randn(vocab, 64, dtype=dtype), torch.randn(rows, 64, dtype=dtype)
    weight[39] = weight[vocab // 2] = weight[7] = x[0] * 2  # three equal logits, the largest in row 0 (7, 39: a lane)
    b = torch.zeros(vocab, dtype=dtype) if bias else None
    proj = Projection(weight, b, pack=True)
    tokens, logprobs = proj.greedy_picks(x)
    logits = proj.float_outputs(x)
    expected = logits.argmax(dim=-1)  # the first of equal maxima
    assert torch.equal(tokens, expected)
    assert tokens[0] == 7
    raw = logits.gather(1, expected[:, None]).squeeze(1) - logits.logsumexp(dim=-1)
    torch.testing.assert_close(logprobs, raw, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,amx", greedy_heads())
def test_greedy_picks_mark_rows_with_logits_that_are_not_finite(monkeypatch: pytest.MonkeyPatch, dtype, amx):
    """A row whose logits hold a NaN or an infinity has a NaN logprob (the runner then takes the full logits); the
    other rows keep their picks. Past AMX_OWN_MAX_ROWS on AMX, or on neither matmul, there is no greedy pass."""
    if amx:
        monkeypatch.setattr(projection, "amx_matmul_kernels", amx_matmul_kernels)
    torch.manual_seed(0)
    proj = Projection(torch.randn(100, 64, dtype=dtype), None, pack=True)
    x = torch.randn(3, 64, dtype=dtype)
    x[1, 5], x[2, 9] = float("nan"), float("inf")
    tokens, logprobs = proj.greedy_picks(x)
    assert torch.isnan(logprobs[1:]).all() and not torch.isnan(logprobs[0])
    assert tokens[0] == proj.float_outputs(x[:1]).argmax()
    if amx:
        assert proj.greedy_picks(torch.randn(projection.AMX_OWN_MAX_ROWS + 1, 64, dtype=dtype)) is None
    assert Projection(torch.randn(100, 64, dtype=dtype), None, pack=False).greedy_picks(x) is None


@needs_amx
def test_amx_linear_kernel_rejects_mismatched_inputs():
    kernels = amx_matmul_kernels()
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.pack_amx_linear(torch.randn(16, 48, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernels.pack_amx_linear(torch.randn(16, 64))
    tiles = kernels.pack_amx_linear(torch.randn(40, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="pack_amx_linear"):
        kernels.amx_linear(torch.randn(3, 96, dtype=torch.bfloat16), tiles, None, 40)
    with pytest.raises(RuntimeError, match="pack_amx_linear"):
        kernels.amx_linear(torch.randn(3, 64, dtype=torch.bfloat16), tiles, None, 60)
    with pytest.raises(RuntimeError, match="bias"):
        kernels.amx_linear(torch.randn(3, 64, dtype=torch.bfloat16), tiles, torch.randn(39, dtype=torch.bfloat16), 40)
    with pytest.raises(RuntimeError, match="even number of rows"):
        kernels.pack_amx_linear(torch.randn(41, 64, dtype=torch.bfloat16), gated=True)
    gated = kernels.pack_amx_linear(torch.randn(2 * 40, 64, dtype=torch.bfloat16), gated=True)  # 3 pairs of panels
    with pytest.raises(RuntimeError, match="gated=True"):
        kernels.amx_linear(torch.randn(3, 64, dtype=torch.bfloat16), gated, None, 80, gated=True)
    with pytest.raises(RuntimeError, match="bias"):  # a gated bias covers gate and up
        kernels.amx_linear(torch.randn(3, 64, dtype=torch.bfloat16), gated, torch.randn(40, dtype=torch.bfloat16), 40,
                           gated=True)
    # the greedy pass takes the same operands as the plain matmul, ungated
    with pytest.raises(RuntimeError, match="pack_amx_linear"):
        kernels.amx_greedy_head(torch.randn(3, 96, dtype=torch.bfloat16), tiles, None, 40)
    with pytest.raises(RuntimeError, match="bias"):
        kernels.amx_greedy_head(torch.randn(3, 64, dtype=torch.bfloat16), tiles, torch.randn(39, dtype=torch.bfloat16), 40)
    with pytest.raises(RuntimeError, match="pack_amx_linear"):
        kernels.amx_greedy_head(torch.randn(3, 64, dtype=torch.bfloat16), gated, None, 40)


@needs_amx
@pytest.mark.parametrize("rows", [1, 300, projection.AMX_OWN_MAX_ROWS, projection.AMX_OWN_MAX_ROWS + 1])
def test_bf16_projections_take_amx_where_the_cpu_has_it(monkeypatch: pytest.MonkeyPatch, rows):
    """pagedllm's AMX matmul up to AMX_OWN_MAX_ROWS rows, oneDNN's above; the MLP's gate/up stays on the AMX matmul
    at every size, which applies silu(gate) * up itself (the caller's activation is never called)."""
    monkeypatch.setattr(projection, "amx_matmul_kernels", amx_matmul_kernels)  # the AMX matmuls back on
    torch.manual_seed(rows)
    weight, bias = torch.randn(96, 64, dtype=torch.bfloat16), torch.randn(96, dtype=torch.bfloat16)
    gate_up = (torch.randn(2 * 40, 64) / 8).to(torch.bfloat16)
    proj, gated = Projection(weight, bias, pack=True), GatedProjection(gate_up, None, pack=True)
    assert proj._amx is not None and proj._kernels is None and gated.fused
    assert "AMX" in projection.describe_matmul(torch.bfloat16, torch.device("cpu"))
    real, onednn_calls = projection.onednn_linear, []
    monkeypatch.setattr(projection, "onednn_linear", lambda *args: onednn_calls.append(args[0].shape[0]) or real(*args))
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    activations = []
    got, got_gated = proj(x), gated(x, lambda gate_up: activations.append(gate_up) or silu_mul(gate_up))
    assert len(onednn_calls) == (1 if rows > projection.AMX_OWN_MAX_ROWS else 0) and not activations
    torch.testing.assert_close(got.float(), F.linear(x.float(), weight.float(), bias.float()), rtol=2**-8, atol=1e-2)
    torch.testing.assert_close(got_gated.double(), gated_reference(x, gate_up, None), rtol=2**-6, atol=1e-2)


@needs_amx
def test_bf16_weights_whose_inputs_do_not_fill_amx_tiles_keep_the_other_matmul(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(projection, "amx_matmul_kernels", amx_matmul_kernels)  # the AMX matmuls back on
    weight, x = torch.randn(20, 48, dtype=torch.bfloat16), torch.randn(5, 48, dtype=torch.bfloat16)
    proj = Projection(weight, None, pack=True)
    assert proj._amx is None and proj._kernels is not None
    torch.testing.assert_close(proj(x).float(), F.linear(x.float(), weight.float()), rtol=2**-8, atol=1e-2)


def test_only_float_weights_on_the_cpu_use_the_linear_kernel():
    assert linear_kernels(torch.float16) is None
    assert Projection(torch.randn(8, 4), None, pack=False)._packed is None


@pytest.mark.parametrize("native", [True, False])
def test_bfloat16_is_packed_only_with_native_bf16(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    import pagedllm.model.projection as projection

    monkeypatch.setattr(projection, "has_native_bf16", lambda: native)
    assert can_pack(torch.bfloat16) == (native and torch.backends.mkldnn.is_available())
    assert can_pack(torch.float32) == torch.backends.mkldnn.is_available()


@pytest.mark.skipif(not can_pack(torch.bfloat16), reason="this CPU computes bfloat16 by emulation: not packed")
def test_packed_bfloat16_projection_equals_linear():
    torch.manual_seed(0)
    weight = torch.randn(96, 64, dtype=torch.bfloat16)
    bias = torch.randn(96, dtype=torch.bfloat16)
    x = torch.randn(19, 64, dtype=torch.bfloat16)
    packed = Projection(weight, bias, pack=True)(x)
    assert packed.dtype == torch.bfloat16
    torch.testing.assert_close(packed.float(), F.linear(x, weight, bias).float(), rtol=1e-2, atol=1e-2)


def test_dtype_auto_follows_the_cpu_flags():
    from pagedllm.model.dtype import resolve_dtype

    assert resolve_dtype("auto", ["avx2", "avx512f", "avx512_bf16"]) == torch.bfloat16
    assert resolve_dtype("auto", ["avx2", "amx_bf16"]) == torch.bfloat16
    assert resolve_dtype("auto", ["avx2", "fma"]) == torch.float32
    assert resolve_dtype("float32", ["avx512_bf16"]) == torch.float32
    assert resolve_dtype("bfloat16", []) == torch.bfloat16


def gated_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return silu_mul(F.linear(x.double(), weight.double(), None if bias is None else bias.double()))


@pytest.mark.parametrize("dtype,path", [(torch.float32, None), (torch.bfloat16, "dot"), (torch.bfloat16, "widen")])
@pytest.mark.parametrize("rows", [1, 9, 513])  # register tiles of 8 or 6 rows, passes of 512
@pytest.mark.parametrize("intermediate,in_features", [(1, 4), (7, 16), (8, 8), (23, 64), (24, 6), (50, 130),
                                                      (1536, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_kernel_equals_linear_then_silu_mul(dtype, path, rows, intermediate, in_features, bias):
    """24 outputs per panel with AVX-512 (23, 24 and 50: a partial, a whole and a third, partial panel), 8 with
    AVX2 (7, 8 and 23 likewise)."""
    if linear_kernels(dtype) is None:
        pytest.skip(f"no {dtype} linear kernel here")
    torch.manual_seed(rows + intermediate)
    x = torch.randn(rows, in_features).to(dtype)
    weight = (torch.randn(2 * intermediate, in_features) / in_features**0.5).to(dtype)
    b = torch.randn(2 * intermediate).to(dtype) if bias else None
    gated = GatedProjection(weight, b, pack=True)
    with bf16_matmul_path(path):
        got = gated(x, lambda gate_up: pytest.fail("the activation is the kernel's"))
    assert gated.fused and got.dtype == dtype and got.shape == (rows, intermediate)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2**-8, atol=2e-3)
    torch.testing.assert_close(got.double(), gated_reference(x, weight, b), **tol)


def test_gated_projection_without_the_kernel_applies_the_callers_activation(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(projection, "linear_kernels", lambda dtype: None)
    torch.manual_seed(0)
    weight, x = torch.randn(2 * 40, 32), torch.randn(7, 32)
    gated = GatedProjection(weight, None, pack=True)
    assert not gated.fused
    torch.testing.assert_close(gated(x, silu_mul).double(), gated_reference(x, weight, None), rtol=1e-5, atol=1e-5)


@needs_linear_kernel
def test_gated_kernel_rejects_mismatched_inputs():
    kernels = linear_kernels(torch.float32)
    with pytest.raises(RuntimeError, match="even number of rows"):
        kernels.pack_linear(torch.randn(49, 40), gated=True)
    panels = kernels.pack_linear(torch.randn(2 * 30, 40), gated=True)
    with pytest.raises(RuntimeError, match="gated"):
        kernels.linear(torch.randn(3, 40), panels, None, 60, gated=True)  # 60 outputs need more panels
    with pytest.raises(RuntimeError, match="bias"):
        kernels.linear(torch.randn(3, 40), panels, torch.randn(30), 30, gated=True)  # the bias has 2 x 30


def test_the_startup_log_names_the_matmul(monkeypatch: pytest.MonkeyPatch):
    from pagedllm.model.projection import describe_matmul

    cpu = torch.device("cpu")
    assert describe_matmul(torch.float32, torch.device("cuda")) == "torch"
    expected = "pagedllm's" if linear_kernels(torch.float32) is not None else "oneDNN (prepacked)"
    assert describe_matmul(torch.float32, cpu) == expected
    if linear_kernels(torch.bfloat16) is not None:
        with bf16_matmul_path("widen"):
            assert "widened to float32 FMAs (timed faster here" in describe_matmul(torch.bfloat16, cpu)
        with bf16_matmul_path("dot"):
            assert describe_matmul(torch.bfloat16, cpu).startswith("pagedllm's, vdpbf16ps")
    monkeypatch.setattr(projection, "linear_kernels", lambda dtype: None)
    assert describe_matmul(torch.float32, cpu) == "oneDNN (prepacked)"


@needs_amx
@pytest.mark.parametrize("gated", [False, True])
def test_amx_linear_rows_in_blocks_equal_each_row_alone(gated):
    """A batch larger than one block of rows (kRowBlockBytes of x: 128 rows of 1536 inputs) is multiplied block by
    block, a partial row tile last; every row's sums are made in the same order as for that row alone."""
    kernels = amx_matmul_kernels()
    torch.manual_seed(7)
    x = torch.randn(300, 1536, dtype=torch.bfloat16)
    weight = (torch.randn(80, 1536) / 40).to(torch.bfloat16)
    bias = torch.randn(80, dtype=torch.bfloat16)
    tiles = kernels.pack_amx_linear(weight, gated=gated)
    out_features = 40 if gated else 80
    got = kernels.amx_linear(x, tiles, bias, out_features, gated=gated)
    alone = torch.cat([kernels.amx_linear(x[r : r + 1], tiles, bias, out_features, gated=gated) for r in range(300)])
    assert torch.equal(got, alone)
    if not gated:
        expected = F.linear(x.float(), weight.float(), bias.float())
        torch.testing.assert_close(got.float(), expected, rtol=2**-7, atol=2e-2)
