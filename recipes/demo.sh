#!/usr/bin/env bash
# rlflow demo: from nothing to a model that learned a task with RL, in 4-10 minutes on 2 CPU cores.
#
#   make demo                              # or, with the .venv active: recipes/demo.sh
#   make demo DEMO_STEPS=30 DEMO_SEED=1    # knobs (environment variables):
#     DEMO_STEPS  GRPO steps                                   (default 30)
#     DEMO_SEED   seed of the model init, the task data, SFT and GRPO (default 0)
#     DEMO_OUT    output folder                                (default outputs/demo)
#     DEMO_SFT_STEPS  SFT warm-start steps                     (default 200)
#
# Every phase is a public entrypoint, exactly what a user would type; phases 3 and 4 are the
# recipes recipes/sft_tiny_cpu.sh and recipes/grpo_tiny_cpu.sh (one commented Hydra command line
# each). Running the demo again with the same knobs skips the phases it finished and resumes the
# one it was in; other knobs start it over.
# The same commands run on a GPU machine: every device setting is `auto`. docs/demo.md explains
# each phase and how to point them at a real model and dataset.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${DEMO_STEPS:-30}
SEED=${DEMO_SEED:-0}
OUT=${DEMO_OUT:-outputs/demo}
SFT_STEPS=${DEMO_SFT_STEPS:-200}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false   # Ray: loopback + token auth (rlflow's default)
export WANDB_MODE=${WANDB_MODE:-offline} PYTHONUNBUFFERED=1

# Same knobs as the last run: skip the phases it finished and resume the one it was in (from its
# newest checkpoint). Other knobs: start over in a clean folder (no stale checkpoints).
source recipes/lib/demo_phases.sh   # demo_start (the knob check) and phase
demo_start "$OUT" "seed=$SEED steps=$STEPS sft_steps=$SFT_STEPS"

# 1. The model: a ~0.7M-parameter Qwen2-architecture LM with a locally trained tokenizer (an HF folder).
phase preset python -m rlflow.data.presets --out "$OUT/model" --preset tiny --seed "$SEED"

# 2. The task: chains of three one-digit additions/subtractions, "What is 7+5-3+8? Answer with the
#    number after ####.", scored 1 when the number after #### is right. Writes train/val (RL
#    prompts) and sft_train/sft_val (worked solutions, one step per line).
phase data python -m rlflow.data.tasks --task chain_arith --digits 1 --num-ops 3 --train 8000 --val 256 --overwrite \
  --seed "$SEED" --out "$OUT/data"

# 3. SFT warm start on the worked solutions ("7+5=12\n12-3=9\n9+8=17\n#### 17"): main_sft, FSDP2 in a
#    Ray worker group. 200 steps leave the model at 17-70% val accuracy, 41% on average (docs/demo.md).
phase sft env MODEL="$OUT/model" DATA="$OUT/data" OUT="$OUT/sft" STEPS="$SFT_STEPS" SEED="$SEED" \
  recipes/sft_tiny_cpu.sh

# 4. GRPO from the SFT model: main_ppo with the vLLM rollout, the FSDP2 actor and reference fused in
#    Ray worker processes, 8 samples per prompt, the task's rule reward, greedy val accuracy every 5
#    steps; +18 points of val accuracy in 30 steps on average over seeds 0-3 (docs/demo.md).
phase grpo env MODEL="$OUT/sft/hf" DATA="$OUT/data" OUT="$OUT/grpo" STEPS="$STEPS" SEED="$SEED" \
  recipes/grpo_tiny_cpu.sh

# 5. Final evaluation and report: greedy val accuracy of the model before SFT, after SFT and
#    after GRPO; curves.png, samples.md and summary.md in $OUT. It always runs.
cat "$OUT"/.done-{preset,data,sft,grpo} > "$OUT/phase_times.tsv"
printf '\n==== [report]\n'
python -m rlflow.observability.report --out "$OUT" \
  --run sft="$OUT/sft" --run grpo="$OUT/grpo" \
  --model before_sft="$OUT/model" --model after_sft="$OUT/sft/hf" --model after_grpo="$OUT/grpo/hf" \
  --data "$OUT/data/val.parquet" --max-new-tokens 32 --phase-times "$OUT/phase_times.tsv"
