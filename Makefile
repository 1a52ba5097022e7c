# Every target sets itself up on a fresh machine: `make test` and `make run` install first if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROMPT ?= What is PagedAttention? Answer in two sentences.

.PHONY: install test test-avx2 test-fast run serve bench bench-peers clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned, so the CPU wheel on disk is used and no CUDA build is pulled
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pagedllm fetch-default-model
	$(BIN)/python -m pagedllm.kernels  # builds the compiled CPU kernels for this CPU (falls back if it cannot)
	touch $(STAMP)

# On a CPU with AVX-512 the kernels' tests run a second time on an AVX2 build (make test-avx2).
test: install
	$(BIN)/python -m pytest -q
	if grep -qw avx512f /proc/cpuinfo; then $(MAKE) --no-print-directory test-avx2; fi

# The compiled kernels' AVX2 path on a CPU that has more: their tests on a build for AVX2 alone.
test-avx2: install
	PAGEDLLM_KERNELS_ISA=avx2 $(BIN)/python -m pytest -q tests/attention tests/model tests/engine/test_sampling_ops.py

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

run: install
	$(BIN)/pagedllm generate --chat "$(PROMPT)"

serve: install
	$(BIN)/pagedllm serve

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# pagedllm vs vLLM's CPU build vs transformers, same requests; long, not part of the tests.
# Installs vLLM in .venv-peers; results in out/peers/ (OUT, WORKLOADS, DTYPES, RUN_TIMEOUT override).
bench-peers: install
	bash scripts/bench_peers.sh
