#!/usr/bin/env bash
# The CUDA path in one short run, for a GPU machine: every engine against plain PyTorch and the HF model
# on the GPU (`make test-gpu`'s tests), then the engine throughput bench at fp32 and at bf16 compute on
# the 500m preset (Qwen2.5-0.5B's layer shapes). Neither needs Ray or vLLM.
#
#   bash bench/gpu_check.sh [OUT_DIR]          (default outputs/gpu_check; PY defaults to .venv/bin/python)
#   ENGINES="fsdp fsdp2 megatron" bash bench/gpu_check.sh      (default: every registered engine)
#
# On a machine where the stack was not installed with `make install DEVICE=cuda`, set PY to a Python
# with CUDA torch and put the missing pure-Python packages (megatron-core, torchtitan, omegaconf, hydra,
# datasets and their needs) in ./.gpu_site: it is added to PYTHONPATH when present.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/gpu_check}
PY=${PY:-.venv/bin/python}
[ -d .gpu_site ] && export PYTHONPATH="$PWD/.gpu_site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline
mkdir -p "$OUT"
failed=()
engine_args=()
if [ -n "${ENGINES:-}" ]; then
  export RLFLOW_GPU_ENGINES="$ENGINES"
  read -ra engine_args <<<"--engines $ENGINES"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY bench/machine.py

echo "== engines on the GPU (tests marked gpu)"
timeout 300 $PY -m pytest -m gpu tests/engines/test_engine_cuda.py -p no:cacheprovider -q -rA \
  2>&1 | tee "$OUT/test_gpu.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|error" || true
grep -qE "^[0-9]+ passed" <(tail -1 "$OUT/test_gpu.log") || failed+=("tests")

for dtype in float32 bfloat16; do
  echo "== engine throughput, cuda, compute $dtype"
  timeout 240 $PY bench/engine_throughput.py --device cuda --param-dtype "$dtype" --size 500m --rows 4 \
    --seq-len 1024 --rounds 3 --steps-per-round 3 --no-variants "${engine_args[@]}" --json "$OUT/engine_throughput_cuda_$dtype.json" \
    2>&1 | grep -v "Loading weights" | tee "$OUT/engine_throughput_cuda_$dtype.log" | tail -8 \
    || failed+=("bench $dtype")
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: failed: ${failed[*]}"
  exit 1
fi
echo "gpu_check: all passed"
