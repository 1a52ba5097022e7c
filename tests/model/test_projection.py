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


def test_bfloat16_is_not_packed():
    assert not can_pack(torch.bfloat16)
    weight = torch.randn(8, 4, dtype=torch.bfloat16)
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    torch.testing.assert_close(Projection(weight, None, pack=False)(x), F.linear(x, weight))
