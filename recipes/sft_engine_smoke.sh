#!/usr/bin/env bash
# SFT engine smoke and parity: the same 5-step SFT job on every registered engine at world
# size 1 and 2 (plain torchrun, no Ray), then every loss curve is compared step by step
# with the first engine's at world size 1 (fp32: 1e-4 relative per step; docs/sft.md).
# A new engine joins by being registered (rlflow.engines.ENGINE_REGISTRY) with its
# rlflow/configs/engine/<name>.yaml; nothing here changes.
#
#   bash recipes/sft_engine_smoke.sh [OUT_DIR]        (default: outputs/sft_engine_smoke)
#   ENGINES="fsdp fsdp2" WORLD_SIZES="1 2" STEPS=5 bash recipes/sft_engine_smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
OUT=${1:-outputs/sft_engine_smoke}
STEPS=${STEPS:-5}
WORLD_SIZES=${WORLD_SIZES:-"1 2"}
ENGINES=${ENGINES:-$($PY -c "from rlflow.engines import ENGINE_REGISTRY; print(' '.join(ENGINE_REGISTRY.names()))")}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

$PY -m rlflow.data.presets --out "$OUT/model" --preset tiny --seed 0
$PY -m rlflow.data.tasks --task addition --digits 2 --out "$OUT/data" --train 96 --val 24 --seed 0 --overwrite

for engine in $ENGINES; do
  for ws in $WORLD_SIZES; do
    echo "== engine=$engine world_size=$ws"
    $PY -m torch.distributed.run --standalone --nproc_per_node "$ws" -m rlflow.trainer.main_sft \
      engine="$engine" trainer.launcher=torchrun trainer.device=cpu \
      model.path="$OUT/model" \
      data.train_files="[$OUT/data/sft_train.parquet]" data.val_files=[] \
      data.train_batch_size=16 engine.micro_batch_size=4 engine.use_remove_padding=true \
      engine.dtype=float32 engine.param_dtype=float32 engine.seed=0 \
      engine.optimizer.lr=1e-3 engine.lr_scheduler.name=constant engine.lr_scheduler.warmup_steps=0 \
      trainer.total_training_steps="$STEPS" trainer.logger=[console,jsonl] trainer.resume_mode=disable \
      trainer.default_local_dir="$OUT/runs/${engine}_ws${ws}"
  done
done

$PY - "$OUT/runs" "$STEPS" $ENGINES -- $WORLD_SIZES <<'EOF'
import json, sys
from pathlib import Path

runs, steps, rest = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
engines, world_sizes = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
RTOL = 1e-4


def curve(engine: str, ws: str) -> list[float]:
    records = [json.loads(line) for line in (runs / f"{engine}_ws{ws}" / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["train/loss"] for r in records if "train/loss" in r}
    return [losses[s] for s in range(1, steps + 1)]


reference = curve(engines[0], world_sizes[0])
print(f"reference {engines[0]} ws={world_sizes[0]}: " + " ".join(f"{x:.6f}" for x in reference))
failed = []
for engine in engines:
    for ws in world_sizes:
        rel = [abs(a - b) / abs(b) for a, b in zip(curve(engine, ws), reference)]
        ok = max(rel) <= RTOL
        print(f"{'ok  ' if ok else 'FAIL'} {engine:12s} ws={ws}  max rel diff {max(rel):.2e}")
        if not ok:
            failed.append(f"{engine} ws={ws}")
if failed:
    sys.exit(f"loss curves differ from the reference by more than {RTOL} relative: {', '.join(failed)}")
print(f"all {len(engines) * len(world_sizes)} runs match within {RTOL} relative per step")
EOF
