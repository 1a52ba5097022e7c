"""Where the compiled CPU kernels cannot be built, the build logs one line and returns None, "auto" resolves
to the torch path, and the engine produces the same greedy tokens as with the kernels."""

import logging
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pagedllm.attention.compiled
import pagedllm.kernels
from pagedllm.config import EngineConfig
from pagedllm.engine import sampler
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.model_runner import ModelRunner
from pagedllm.errors import InvalidInputError
from pagedllm.kernels import build
from pagedllm.model import decoder_stack, projection
from pagedllm.model.loader import load_model
from pagedllm.sampling_params import SamplingParams

BUILD_LOGGER = "pagedllm.kernels.build"


def build_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == BUILD_LOGGER]


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(build.DISABLE_ENV, raising=False)
    monkeypatch.setenv("CXX", "/nonexistent/bin/c++")


def test_missing_compiler_logs_one_warning_and_returns_none(no_compiler, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="pagedllm"):
        assert build.build_cpu_kernels() is None
    [record] = build_records(caplog)
    assert record.levelno == logging.WARNING
    assert "no C++ compiler" in record.getMessage() and "\n" not in record.getMessage()


def test_failing_compiler_logs_one_warning_and_returns_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'error: this compiler is broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.delenv(build.DISABLE_ENV, raising=False)
    monkeypatch.setenv("CXX", str(broken))
    monkeypatch.setenv("PAGEDLLM_CACHE_DIR", str(tmp_path / "cache"))  # never touch the machine's build cache
    with caplog.at_level(logging.DEBUG, logger="pagedllm"):
        assert build.build_cpu_kernels() is None
    warnings = [r for r in build_records(caplog) if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "failed" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(build.DISABLE_ENV, "1")
    with caplog.at_level(logging.DEBUG, logger="pagedllm"):
        assert build.build_cpu_kernels() is None
    [record] = build_records(caplog)
    assert build.DISABLE_ENV in record.getMessage()


@pytest.fixture
def without_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way the code reaches the kernels sees the real no-compiler result (None), so a stray compiled
    call would raise instead of quietly using the kernels built on this machine. The process's cached load
    happens first, with the compiler: were it first asked here, it would keep None for the later tests."""
    pagedllm.kernels.load_cpu_kernels()
    monkeypatch.delenv(build.DISABLE_ENV, raising=False)
    monkeypatch.setenv("CXX", "/nonexistent/bin/c++")
    for module in (pagedllm.kernels, build, pagedllm.attention.compiled, projection, decoder_stack, sampler):
        monkeypatch.setattr(module, "load_cpu_kernels", build.build_cpu_kernels)


def test_runner_auto_resolves_to_torch_without_kernels(without_kernels, tiny_llama_dir: Path) -> None:
    model, config = load_model(tiny_llama_dir)
    runner = ModelRunner(model, config, num_blocks=8, block_size=4, dtype=torch.float32, attention_impl="auto")
    assert runner.attention_impl == "fast"
    with pytest.raises(InvalidInputError, match="compiled CPU kernels are unavailable: they did not load"):
        ModelRunner(model, config, num_blocks=8, block_size=4, dtype=torch.float32, attention_impl="compiled")


def greedy_tokens(model_dir: Path) -> tuple[str, list[list[int]]]:
    """The engine's attention impl, and greedy tokens for prompts that share a prefix (prefix caching and
    copy-on-write), are chunked (64 tokens a step) and run in one mixed batch; n=2 forks a sequence.
    float32: in bfloat16 (dtype "auto" on a CPU with native bf16) two correct paths may round apart."""
    config = EngineConfig(model=str(model_dir), dtype="float32", num_blocks=128, block_size=4, max_num_batched_tokens=64)
    engine = LLMEngine(config)
    rng = random.Random(0)
    shared = [rng.randrange(5, 384) for _ in range(30)]
    prompts = [shared + [rng.randrange(5, 384) for _ in range(n)] for n in (3, 40, 9)] + [[7, 8, 9]]
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12)] * 3
    params.append(SamplingParams(n=2, temperature=0.0, ignore_eos=True, max_tokens=12))
    ids = [engine.add_request(None, p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while engine.has_unfinished_requests():
        done.update((out.request_id, out) for out in engine.step() if out.finished)
    return engine.runner.attention_impl, [c.token_ids for i in ids for c in done[i].outputs]


@pytest.fixture(scope="module")
def tokens_with_kernels(tiny_llama_dir: Path) -> tuple[str, list[list[int]]]:
    return greedy_tokens(tiny_llama_dir)


def test_engine_without_kernels_produces_the_same_greedy_tokens(
    tokens_with_kernels: tuple[str, list[list[int]]], without_kernels, tiny_llama_dir: Path
) -> None:
    impl, with_kernels = tokens_with_kernels
    assert impl == "compiled"  # the fixture ran before the kernels were taken away
    impl, without = greedy_tokens(tiny_llama_dir)
    assert impl == "fast"
    assert len(without) == 5 and all(len(t) == 12 for t in without)
    assert without == with_kernels


def test_a_lock_left_by_a_killed_build_does_not_stop_the_next_load(tmp_path: Path) -> None:
    """torch's build lock is a plain file: a build killed midway (Ctrl-C, a killed benchmark) leaves it, and torch
    then waits for it forever. The build's own lock (released by the OS) tells that no load is under way."""
    if pagedllm.kernels.load_cpu_kernels() is None:
        pytest.skip("no compiled kernels here")
    from pagedllm.cache_dir import cache_dir

    build_dir = cache_dir() / "kernels" / build.build_key(build.compiler())
    (build_dir / "lock").touch()  # what the killed build left
    script = "from pagedllm.kernels import load_cpu_kernels; assert load_cpu_kernels() is not None"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, timeout=120, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with build._held_by_this_process(build_dir / ".flock"):  # no other process's load is under way (it has one)
        assert not (build_dir / "lock").exists()


def test_each_torch_installation_has_its_own_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second environment on the machine must not rebuild over the first one's build (torch rebuilds when
    the include paths change), so where torch lies is part of the key."""
    import torch

    cxx = build.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler here")
    here = build.build_key(cxx)
    monkeypatch.setattr(torch, "__file__", "/another/venv/site-packages/torch/__init__.py")
    assert build.build_key(cxx) != here


def test_the_avx2_build_hides_newer_flags_and_targets_haswell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "cpuinfo", lambda field: "fpu avx2 fma avx512f avx512_bf16 amx_tile amx_bf16")
    monkeypatch.setenv(build.ISA_ENV, "avx2")
    assert build.cpu_flags() == ["fpu", "avx2", "fma"] and build.cpu_isa() == ["avx2"]
    assert "-march=haswell" in build.cflags() and "-march=native" not in build.cflags()
    monkeypatch.delenv(build.ISA_ENV)
    assert build.cpu_isa() == ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
    assert "-march=native" in build.cflags()
    monkeypatch.setenv(build.ISA_ENV, "avx512")
    with pytest.raises(InvalidInputError, match="'avx2' or unset, not 'avx512'"):
        build.cpu_flags()


def test_a_damaged_cached_build_is_linked_again(tmp_path: Path) -> None:
    """A cut-short library (an interrupted copy, a full disk) is newer than its objects, so ninja would load it
    as it is, and the process died of SIGBUS; it is linked again from the objects instead."""
    if pagedllm.kernels.load_cpu_kernels() is None:
        pytest.skip("no compiled kernels here")
    from pagedllm.cache_dir import cache_dir

    key = build.build_key(build.compiler())
    library = cache_dir() / "kernels" / key / f"pagedllm_cpu_{key}.so"
    whole = library.read_bytes()
    assert build._whole_elf(library)
    script = "from pagedllm.kernels import load_cpu_kernels; assert load_cpu_kernels() is not None"
    try:
        with build._held_by_this_process(library.parent / ".flock"):  # no load of this build is under way
            library.unlink()  # a new file: a process that has the library mapped keeps the old one
            library.write_bytes(whole[: len(whole) // 2])
        assert not build._whole_elf(library)
        done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, timeout=300, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr  # it died of SIGBUS (-7)
        assert build._whole_elf(library)
    finally:
        with build._held_by_this_process(library.parent / ".flock"):
            if not build._whole_elf(library):
                library.unlink(missing_ok=True)
                library.write_bytes(whole)


@pytest.mark.parametrize("value, disabled", [("1", True), ("yes", True), ("ON", True), ("0", False),
                                             ("false", False), ("", False)])
def test_the_disable_switch_reads_its_value(monkeypatch: pytest.MonkeyPatch, value: str, disabled: bool) -> None:
    monkeypatch.setenv(build.DISABLE_ENV, value)
    assert build.kernels_disabled() is disabled


def test_misspelt_switches_are_refused_not_taken_for_a_failed_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.DISABLE_ENV, "maybe")
    with pytest.raises(InvalidInputError, match="PAGEDLLM_DISABLE_KERNELS is 1/true/yes/on or 0/false/no/off"):
        build.build_cpu_kernels()
    monkeypatch.delenv(build.DISABLE_ENV)
    monkeypatch.setenv(build.ISA_ENV, "AVX2")
    with pytest.raises(InvalidInputError, match="'avx2' or unset, not 'AVX2'"):
        build.build_cpu_kernels()


def test_the_build_key_covers_the_cpu_flags_and_headers(monkeypatch, tmp_path):
    """A build made for another CPU (AVX-512 on an AVX2-only machine) would die of SIGILL, and a changed header
    must rebuild."""
    from pagedllm.kernels import build

    cxx = build.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler here")
    here = build.build_key(cxx)
    monkeypatch.setattr(build, "cpu_flags", lambda: ["fpu", "avx2"])
    assert build.build_key(cxx) != here
    monkeypatch.undo()
    csrc = tmp_path / "csrc"
    shutil.copytree(build.CSRC, csrc)
    monkeypatch.setattr(build, "CSRC", csrc)
    assert build.build_key(cxx) == here
    header = next(csrc.glob("*.h"))
    header.write_text(header.read_text() + "\n// changed\n")
    assert build.build_key(cxx) != here


def test_copying_the_sources_again_leaves_the_copies_as_they_are(tmp_path: Path) -> None:
    """Every load copies the sources into the build folder: a copy already there stays untouched, or its new
    time would make ninja compile everything again at every process start (minutes)."""
    def stamps(folder: Path) -> dict[str, tuple[int, int]]:
        return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}

    first = stamps(build._copy_sources(tmp_path / "src"))
    assert {"paged_attention.cpp", "vec.h"} <= set(first) and not any(name.startswith(".") for name in first)
    assert stamps(build._copy_sources(tmp_path / "src")) == first
