import shutil
import subprocess
from pathlib import Path

import pytest

from pagedllm.bench import native_split
from pagedllm.bench.native_split import classify, parse_line, split

KERNELS = "/root/.cache/pagedllm/kernels/0123/pagedllm_cpu_0123.so"
MATMUL_TILE = "pagedllm::(anonymous namespace)::tile<pagedllm::(anonymous namespace)::F32, 8>"
ATTENTION = "pagedllm::(anonymous namespace)::Kernel<float, 4, (pagedllm::(anonymous namespace)::ManyRows)0>::run_part"


def test_parse_line_reads_the_function_and_the_library():
    assert parse_line(f"    7f2cab59c77c {MATMUL_TILE} ({KERNELS})") == (MATMUL_TILE, KERNELS)
    assert parse_line("  ffffffff82238806 clear_page_erms ([kernel.kallsyms])") == ("clear_page_erms",
                                                                                     "[kernel.kallsyms]")
    assert parse_line("      7f44d9657340 [unknown] (/usr/lib/libgomp.so.1)") == ("[unknown]", "/usr/lib/libgomp.so.1")
    assert parse_line("") is None
    assert parse_line("perf: some warning") is None


@pytest.mark.parametrize(
    ("sym", "dso", "category"),
    [
        (MATMUL_TILE, KERNELS, "matmuls"),
        ("pagedllm::amx_linear(...)", KERNELS, "matmuls"),
        (ATTENTION, KERNELS, "attention kernel"),
        ("pagedllm::(anonymous namespace)::Scratch::resize", KERNELS, "attention kernel"),
        ("at::internal::invoke_parallel<pagedllm::add_rms_norm<float>(...)>", KERNELS, "norms, rotary, SiLU x up"),
        ("pagedllm::write_kv(...)", KERNELS, "KV write, block copies"),
        ("pagedllm::greedy_summary(...)", KERNELS, "sampling passes"),
        ("pagedllm::DecoderStack::run_layers<float>", KERNELS, "other compiled kernels"),
        ("dnnl::impl::cpu::x64::brgemm_kernel", "/venv/torch/lib/libtorch_cpu.so", "matmuls"),
        ("[unknown]", "/venv/torch/lib/libgomp.so.1", "OpenMP runtime (waits, fork/join)"),
        ("_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so.1.0", "Python interpreter"),
        ("at::native::fill_kernel", "/venv/torch/lib/libtorch_cpu.so", "torch (other ops)"),
        ("__memmove_avx512_unaligned_erms", "/usr/lib/x86_64-linux-gnu/libc.so.6", "C library (malloc, memcpy)"),
        ("clear_page_erms", "[kernel.kallsyms]", "OS kernel (page faults, scheduling)"),
        ("something", "/opt/other.so", "other"),
    ],
)
def test_classify_puts_each_function_in_its_part(sym, dso, category):
    assert classify(sym, dso) == category


def test_split_counts_samples_by_part_and_by_function():
    samples = [(MATMUL_TILE, KERNELS)] * 3 + [(ATTENTION, KERNELS)] + [("_PyEval_EvalFrameDefault", "libpython3.so")]
    categories, functions = split(samples)
    assert categories == {"matmuls": 3, "attention kernel": 1, "Python interpreter": 1}
    assert functions.most_common(1) == [(MATMUL_TILE, 3)]


def test_without_perf_it_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(native_split.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="needs Linux perf"):
        native_split.main(["--model", "unused"])


def _perf_can_sample() -> bool:
    perf = shutil.which("perf")
    if perf is None:
        return False
    probe = subprocess.run([perf, "stat", "-e", "task-clock", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _perf_can_sample(), reason="Linux perf is not installed or may not sample here")
def test_a_sampled_run_splits_into_parts(tiny_llama_dir: Path, capsys):
    assert native_split.main(["--model", str(tiny_llama_dir), "--workload", "mixed", "--num-requests", "4",
                              "--max-model-len", "256", "--no-progress", "--top", "3"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "output tok/s over" in out and "samples at 499 Hz" in out
    shares = [float(line.split("%")[0].split()[-1]) for line in out.splitlines() if "CPU s" in line and "%" in line]
    assert shares and abs(sum(shares) - 100.0) < 1.0  # every sample in one part
