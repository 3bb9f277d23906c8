#!/usr/bin/env bash
# GPU check (at most ~8 minutes on one H200): the GPU-marked tests (the vLLM weight push too
# where vLLM is installed), 10 GRPO and 10 replay steps on a SmolLM2-135M-shaped random Llama
# on CUDA (step times, tokens/s, peak memory), and the bf16 vs fp32 log-prob mismatch. From
# the repository root:
#
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# It uses the machine's own torch, transformers and pytest (no `pip install -e .`: the code
# runs from src/). The pure-Python packages the machine lacks (pydantic and its parts) come
# from gpu_wheels/ (git-ignored), built beforehand on a machine with network for the GPU
# machine's Python:  make gpu-bundle PY=3.12  (GPU_WHEELS: another folder)
# Only gpu_check.json is written to OUT_DIR; models, checkpoints and the installed wheels go
# to a temporary folder (GPU_CHECK_WORK).
set -euo pipefail

cd "$(dirname "$0")/.."
OUT="${1:-gpu_check_out}"
WORK="${GPU_CHECK_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/replayrl-gpu-check.XXXXXX")}"
mkdir -p "$OUT" "$WORK"
PY="${PYTHON:-python3}"
WHEELS="${GPU_WHEELS:-gpu_wheels}"

if ! "$PY" -c "import pydantic" 2>/dev/null; then
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "error: pydantic is missing and $WHEELS/ holds no wheels: make gpu-bundle PY=3.x" >&2
        exit 2
    fi
    "$PY" -m pip install --quiet --no-index --no-deps --target "$WORK/site" "$WHEELS"/*.whl
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

# the test modules with GPU-marked tests, and only those (others may import hypothesis,
# which the image lacks); collected before the first CUDA call, so an import error shows here
GPU_TESTS=$(grep -l "^@pytest.mark.gpu" tests/test_*.py | sort)
echo "== collecting the GPU-marked tests:" $GPU_TESTS
"$PY" -m pytest -q --collect-only -m gpu -p no:cacheprovider $GPU_TESTS >/dev/null
"$PY" -c "import replayrl.cli.main, replayrl.run.start"

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; \
print(torch.cuda.get_device_name(0), 'torch', torch.__version__, 'CUDA', torch.version.cuda)"

echo "== GPU-marked tests"
timeout 180 "$PY" -m pytest -q -m gpu -p no:cacheprovider --basetemp "$WORK/pytest" $GPU_TESTS

echo "== 10 GRPO + 10 replay steps, bf16 vs fp32 log-probs"
timeout 300 "$PY" scripts/gpu_check.py --out "$OUT" --work "$WORK/runs" --steps 10

echo "== one sharded learner step (FSDP2, mesh of 1, bf16 parameters), Qwen2.5-0.5B shape"
timeout 240 "$PY" scripts/gpu_check.py --out "$OUT/sharded" --work "$WORK/sharded" \
    --sharded 8x1024 --skip-runs

echo "figures: $OUT/gpu_check.json $OUT/sharded/gpu_check.json"
