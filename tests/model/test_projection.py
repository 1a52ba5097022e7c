"""The packed (oneDNN) projection is the same float32 matmul as torch's linear."""

import pytest
import torch
import torch.nn.functional as F

from pagedllm.model.projection import Projection, can_pack


@pytest.mark.skipif(not can_pack(torch.float32), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("rows,out_features,in_features,bias", [(1, 64, 32, False), (37, 1728, 576, True), (300, 96, 160, False)])
def test_packed_projection_equals_linear(rows, out_features, in_features, bias):
    torch.manual_seed(rows)
    x = torch.randn(rows, in_features)
    weight = torch.randn(out_features, in_features)
    b = torch.randn(out_features) if bias else None
    expected = F.linear(x.double(), weight.double(), None if b is None else b.double())
    packed = Projection(weight, b, pack=True)(x)
    assert packed.dtype == torch.float32 and packed.shape == (rows, out_features)
    torch.testing.assert_close(packed.double(), expected, rtol=1e-5, atol=1e-4)


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
