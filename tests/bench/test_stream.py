"""The stream probe builds on this machine, reads what it says it reads, and fails with clear errors."""

import shutil

import pytest

from pagedllm.bench import stream
from pagedllm.bench.ceiling import LAYER_SHAPES, LAYERS
from pagedllm.model.projection import amx_matmul_kernels

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")


def test_read_reports_the_size_and_a_rate_that_matches_its_time() -> None:
    rate = stream.run_probe(stream.build_probe(), "read", 8, 1, 1)
    assert rate.mb == 8 and rate.ms > 0
    assert rate.gb_per_s == pytest.approx(8 * 2**20 / (rate.ms / 1e3) / 1e9, rel=0.01)


def test_main_prints_a_rate_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    stream.main(["--threads", "1", "--sizes", "4", "8", "--reps", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[1:3]] == ["4", "8"]


@pytest.mark.skipif(amx_matmul_kernels() is None, reason="no AMX tiles here (CPU, build or OS)")
def test_tiles_walk_the_default_models_projections() -> None:
    rate = stream.run_probe(stream.build_probe(), "tiles", 1, 1, 1)
    weights = LAYERS * sum(out * inp for out, inp in LAYER_SHAPES) * 2  # bfloat16
    assert rate.mb == pytest.approx(weights / 2**20, abs=0.05) and rate.gb_per_s > 0


def test_bad_arguments_and_a_missing_compiler_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit):
        stream.main(["--sizes", "0"])
    with pytest.raises(RuntimeError, match="usage"):
        stream.run_probe(stream.build_probe(), "sideways", 1)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(RuntimeError, match="no C compiler"):
        stream.build_probe()
