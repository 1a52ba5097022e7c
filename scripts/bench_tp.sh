#!/usr/bin/env bash
# Tensor parallelism on this machine: `bench throughput` (mixed workload) at tensor_parallel_size 1, 2, 3.
# The default model splits over 1 or 3 ranks only (9 query heads), so sizes 1, 2 and 3 also run on a
# random-weight model of about its size that splits both ways (12 query heads, 6 KV heads, hidden 768,
# MLP 1536, 30 layers, the default's tokenizer). Not part of the tests.
#   OUT=out/tp DTYPE=float32 scripts/bench_tp.sh
# Results: $OUT/<model>_tp<N>.json and .log, the table in $OUT/summary.md.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-out/tp}
DTYPE=${DTYPE:-float32}
BIN=.venv/bin
HF_DIR=${HF_DIR:-out/peers/smollm2-hf}  # the default model as an HF directory (its tokenizer is reused)
SPLIT_DIR=$OUT/split-model

mkdir -p "$OUT"
[ -f "$HF_DIR/config.json" ] || $BIN/pagedllm convert --to-hf "$HF_DIR" || exit 1
if [ ! -f "$SPLIT_DIR/config.json" ]; then
  $BIN/python - "$HF_DIR" "$SPLIT_DIR" <<'PY' || exit 1
import shutil, sys
from pathlib import Path
import torch, transformers
source, target = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=49152, hidden_size=768, intermediate_size=1536, num_hidden_layers=30,
                                  num_attention_heads=12, num_key_value_heads=6, max_position_embeddings=8192,
                                  tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
transformers.LlamaForCausalLM(config).save_pretrained(target)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if (source / name).exists():
        shutil.copy(source / name, target / name)
PY
fi

run() {  # run NAME MODEL SIZE
  echo "[bench-tp $(date +%H:%M:%S)] $1 at size $3" >&2
  $BIN/pagedllm bench throughput --workload mixed ${2:+--model "$2"} --dtype "$DTYPE" --tensor-parallel-size "$3" \
      --no-progress --json "$OUT/$1_tp$3.json" > "$OUT/$1_tp$3.log" 2>&1 || tail -3 "$OUT/$1_tp$3.log" >&2
}
for size in 1 3; do run default "" "$size"; done
for size in 1 2 3; do run split "$SPLIT_DIR" "$size"; done

$BIN/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = ["| model | tensor_parallel_size | out tok/s | vs size 1 |", "|---|---|---|---|"]
for model in ("default", "split"):
    base = None
    for size in (1, 2, 3):
        path = out / f"{model}_tp{size}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        rate = data["runs"][0]["output_tokens_per_s"]
        base = base or rate
        lines.append(f"| {data['model']} | {size} | {rate:.1f} | {rate / base:.2f}x |")
env = data["environment"]
lines.append(f"\n{env['cpu_model']} ({', '.join(env['cpu_isa'])}), {env['cpu_count']} cores, torch {env['torch_version']}, "
             f"pagedllm {env['git_commit']}, dtype {data['engine_config']['dtype']}, workload {data['workload']['name']}")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
