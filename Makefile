# Every target sets itself up on a fresh machine: `make test` and `make run` install first if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROMPT ?= What is PagedAttention? Answer in two sentences.

.PHONY: install test test-fast run serve bench bench-peers clean

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

test: install
	$(BIN)/python -m pytest -q

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
