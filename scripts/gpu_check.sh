#!/usr/bin/env bash
# GPU check (at most ~8 minutes on one H200): the GPU-marked tests, 10 GRPO and 10 replay
# steps on a SmolLM2-135M-shaped random Llama on CUDA (step times, tokens/s, peak memory),
# and the bf16 vs fp32 log-prob mismatch. Run from the repository root:
#
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# It uses the machine's own torch and transformers (no `pip install -e .`: the code runs from
# src/). Pure-Python packages the machine lacks (pydantic and its parts) are installed from
# wheels in gpu_wheels/ (git-ignored), fetched beforehand on a machine with network:
#
#   pip download --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12 \
#       -d gpu_wheels pydantic pydantic-core annotated-types typing-inspection typing-extensions
set -euo pipefail

cd "$(dirname "$0")/.."
OUT="${1:-gpu_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"

if ! "$PY" -c "import pydantic" 2>/dev/null; then
    if ! ls gpu_wheels/*.whl >/dev/null 2>&1; then
        echo "error: pydantic is missing and gpu_wheels/ holds no wheels (see the header)" >&2
        exit 2
    fi
    "$PY" -m pip install --quiet --no-index --no-deps --target "$OUT/site" gpu_wheels/*.whl
    export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; \
print(torch.cuda.get_device_name(0), 'torch', torch.__version__, 'CUDA', torch.version.cuda)"

echo "== GPU-marked tests"
timeout 180 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider

echo "== 10 GRPO + 10 replay steps, bf16 vs fp32 log-probs"
timeout 300 "$PY" scripts/gpu_check.py --out "$OUT" --steps 10

echo "figures: $OUT/gpu_check.json"
