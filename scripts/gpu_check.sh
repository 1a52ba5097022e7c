#!/usr/bin/env bash
# On-GPU checks for issue 11, on one NVIDIA GPU, in under 8 minutes.
#
# Runs where torch, triton and pytest are installed (any versions) but not the server's or GGUF's
# packages (fastapi, uvicorn, pydantic, gguf, openai): no step imports them, and nothing is downloaded.
# Run from anywhere: scripts/gpu_check.sh [OUT_DIR] (default: $OUT, else /tmp/pagedllm_gpu_check).
# Each step's log goes to OUT_DIR/<step>.log and one line per step to OUT_DIR/summary.txt; the exit
# status is non-zero if any step failed.
#
# Steps (the Python ones are in scripts/gpu_check_steps.py):
#   environment  torch / triton / CUDA versions and the GPU
#   imports      the engine path imports none of fastapi, uvicorn, pydantic, gguf, openai
#   kernels      the Triton kernel tests and the engine-on-Triton tests (tests/attention/triton_kernels)
#                compiled on CUDA, no interpreter; there the padded decode step is a real CUDA graph;
#                and sampling on the GPU (tests/engine/test_sampler_device.py: seeded rows reproducible)
#   model        a seeded random-weight model of the default model's shape (SmolLM2-135M), in OUT_DIR/model
#   greedy       engine greedy tokens == transformers generate on that model, float32, CUDA graphs on and off
#   bench        `pagedllm bench throughput` on the mixed workload vs transformers generate (static batches),
#                bfloat16, CUDA graphs on; then the same workload with --enforce-eager (graphs off); then
#                shared-prefix with prefix caching on and off
#   bandwidth    decode attention's achieved bandwidth vs a measured device-to-device copy
#   profile      where a step's host time goes (profile_step, cProfile) with CUDA graphs, the top 25 functions
set -u -o pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT_DIR=${1:-${OUT:-${TMPDIR:-/tmp}/pagedllm_gpu_check}}
mkdir -p "$OUT_DIR"
: > "$OUT_DIR/summary.txt"
failed=0

# step NAME SECONDS FUNCTION: run the function under a time limit, log it, record ok/FAIL and the time taken.
step() {
    local name=$1 limit=$2 fn=$3 start result
    echo "== $name (limit ${limit}s)"
    start=$(date +%s)
    if timeout "$limit" bash -c "$fn" 2>&1 | tee "$OUT_DIR/$name.log"; then
        result=ok
    else
        result=FAIL
        failed=1
    fi
    echo "$name: $result in $(( $(date +%s) - start ))s" | tee -a "$OUT_DIR/summary.txt"
}

environment() {
    "$PYTHON" - <<'PY'
import torch, triton
print(f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}")
if not torch.cuda.is_available():
    raise SystemExit("torch sees no CUDA device")
props = torch.cuda.get_device_properties(0)
print(f"{props.name}: {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB")
PY
}

imports() {
    "$PYTHON" scripts/gpu_check_steps.py imports
}

kernel_tests() {
    # TRITON_INTERPRET unset: the kernels compile for the GPU; the conftest then puts the tensors on CUDA.
    env -u TRITON_INTERPRET PAGEDLLM_TRITON_DEVICE=cuda \
        "$PYTHON" -m pytest -q -p no:cacheprovider --durations=5 tests/attention/triton_kernels \
        tests/engine/test_sampler_device.py
}

make_model() {
    "$PYTHON" scripts/gpu_check_steps.py make-model "$OUT_DIR/model"
}

greedy() {
    "$PYTHON" scripts/gpu_check_steps.py greedy "$OUT_DIR/model" --device cuda
}

bench() {
    # graphs on, with the transformers baseline in the same process; then graphs off (the engine alone)
    "$PYTHON" -m pagedllm bench throughput --model "$OUT_DIR/model" --device cuda --dtype bfloat16 \
        --workload mixed --baseline hf --no-progress --json "$OUT_DIR/bench_graphs.json" &&
    "$PYTHON" -m pagedllm bench throughput --model "$OUT_DIR/model" --device cuda --dtype bfloat16 \
        --workload mixed --enforce-eager --no-progress --json "$OUT_DIR/bench_eager.json" &&
    "$PYTHON" scripts/gpu_check_steps.py graphs "$OUT_DIR" &&
    "$PYTHON" -m pagedllm bench throughput --model "$OUT_DIR/model" --device cuda --dtype bfloat16 \
        --workload shared-prefix --compare-prefix-caching --no-progress
}

bandwidth() {
    "$PYTHON" scripts/gpu_check_steps.py bandwidth
}

profile() {
    "$PYTHON" -m pagedllm.bench.profile_step --model "$OUT_DIR/model" --device cuda --dtype bfloat16 \
        --workload mixed --no-progress --top 25
}

export PYTHON OUT_DIR
export -f environment imports kernel_tests make_model greedy bench bandwidth profile
step environment 30 environment
step imports 30 imports
step kernels 130 kernel_tests
step model 30 make_model
step greedy 50 greedy
step bench 130 bench
step bandwidth 30 bandwidth
step profile 40 profile

cat "$OUT_DIR/summary.txt"
exit $failed
