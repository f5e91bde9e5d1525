#!/usr/bin/env bash
# SFT warm start of the tiny preset on a synthetic task's worked solutions (CPU: ~1.5 min; GPU: seconds).
#
#   recipes/sft_tiny_cpu.sh [extra Hydra overrides...]
#
# Inputs (environment): MODEL  HF folder to start from     (default outputs/demo/model)
#                       DATA   task folder from `python -m rlflow.data.tasks` (default outputs/demo/data)
#                       OUT    run folder: checkpoints, metrics.jsonl, hf/ (default outputs/sft_tiny)
#                       STEPS  optimizer steps              (default 200)
#                       SEED   data-order seed              (default 0)
# Build the inputs first, e.g.:
#   python -m rlflow.data.presets --out outputs/demo/model --preset tiny
#   python -m rlflow.data.tasks --task chain_arith --digits 1 --num-ops 3 --train 8000 --val 256 --out outputs/demo/data
set -euo pipefail
MODEL=${MODEL:-outputs/demo/model}
DATA=${DATA:-outputs/demo/data}
OUT=${OUT:-outputs/sft_tiny}
STEPS=${STEPS:-200}
SEED=${SEED:-0}

args=(
  engine=fsdp2                                  # the FSDP2 engine, in a Ray worker group
  model.path="$MODEL" model.preset=null         # start from this HF folder (never rebuild it)
  data.train_files="[$DATA/sft_train.parquet]"  # chat rows: user prompt, assistant worked solution
  data.val_files="[$DATA/sft_val.parquet]"      # validation loss on held-out problems
  data.train_batch_size=32                      # samples per optimizer step
  data.seed="$SEED"                             # shuffling seed
  engine.micro_batch_size=32                    # the whole batch in one forward/backward (tiny model)
  engine.optimizer.lr=3e-3                      # a 0.7M-parameter model takes a high rate
  engine.lr_scheduler.name=constant             # no decay: a model annealed to a sharp minimum is knocked out
  engine.lr_scheduler.warmup_steps=20           #   of it by the first RL updates (docs/demo.md)
  trainer.total_training_steps="$STEPS"
  trainer.test_freq=100                         # validation loss every 100 steps
  trainer.save_freq=100                         # checkpoint every 100 steps; a re-run resumes from the newest
  trainer.resume_mode=auto
  trainer.default_local_dir="$OUT"              # metrics.jsonl, global_step_N/, and the final HF folder hf/
)
exec python -m rlflow.trainer.main_sft "${args[@]}" "$@"
