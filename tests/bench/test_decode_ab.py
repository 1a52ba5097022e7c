"""decode_ab times each build on decodes over per-layer caches, blocks shuffled and in order."""

import re

import pytest
import torch
from compiled_kernels import require_compiled_kernels

from pagedllm.bench import decode_ab


def test_decode_layers_use_every_block_once_in_the_order_asked() -> None:
    for in_order in (False, True):
        ((cache, meta),) = decode_ab.make_layers([20, 37], 16, in_order, 1, torch.float32)
        tables = [row[:count].tolist() for row, count in zip(meta.block_tables, (2, 3))]
        assert sorted(tables[0] + tables[1]) == list(range(5)) and cache.shape[2] == 5
        assert meta.seq_lens.tolist() == [21, 38] and meta.query_start_loc.tolist() == [0, 1, 2]
        if in_order:
            assert tables == [[0, 1], [2, 3, 4]]


def test_decode_ab_prints_a_rate_per_build_and_layout(capsys: pytest.CaptureFixture[str]) -> None:
    build = require_compiled_kernels().__file__
    args = [build, build, "--layers", "2", "--seqs", "3", "--block-sizes", "16", "--reps", "1", "--threads", "1"]
    assert decode_ab.main(args) == 0
    lines = capsys.readouterr().out.splitlines()[-2:]
    for line, order in zip(lines, ("shuffled", "in order")):
        match = re.fullmatch(rf"  blocks of  16, {order} +(\d+\.\d\d) +(\d+\.\d) +(\d+\.\d\d) +(\d+\.\d)", line)
        assert match and all(float(x) > 0 for x in match.groups())
