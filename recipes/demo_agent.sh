#!/usr/bin/env bash
# rlflow agentic demo: a tiny model learns to use a calculator tool with multi-turn GRPO (2 CPU cores; 7.5 min on AVX-512).
#
#   make demo-agent                                  # or, with the .venv active: recipes/demo_agent.sh
#   make demo-agent DEMO_SEED=1                      # knobs (environment variables):
#     DEMO_STEPS      GRPO steps, with tools and without (default 10)
#     DEMO_SEED       seed of the model init, the task data, SFT and GRPO (default 0)
#     DEMO_OUT        output folder (default outputs/demo_agent)
#     DEMO_SFT_STEPS  SFT warm-start steps on the traces (default 1200)
#
# Phases, each a public entry point (docs/agents.md, "The agentic demo"): the tiny preset; the tool_product
# task ("What is 47*86? Use the calculator, ..."); SFT on traces that call the calculator; GRPO with the
# tool_agent loop (recipes/grpo_tool_tiny_cpu.sh); the same GRPO budget without tools (the baseline: every
# call is answered "unknown tool"); the report, whose accuracies run through the tool loop. Running it again
# with the same knobs skips the phases it finished.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${DEMO_STEPS:-10}
SEED=${DEMO_SEED:-0}
OUT=${DEMO_OUT:-outputs/demo_agent}
SFT_STEPS=${DEMO_SFT_STEPS:-1200}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
export WANDB_MODE=${WANDB_MODE:-offline} PYTHONUNBUFFERED=1

source recipes/lib/demo_phases.sh   # demo_start (the knob check) and phase
demo_start "$OUT" "seed=$SEED steps=$STEPS sft_steps=$SFT_STEPS"

# 1. The model: the tiny preset (0.7M parameters, a locally trained tokenizer), as an HF folder.
phase preset python -m rlflow.data.presets --out "$OUT/model" --preset tiny --seed "$SEED"

# 2. The task: products of two 2-digit numbers. RL rows name the tool_agent loop. 30% of the SFT rows are whole
#    conversations (the call <tool_call>{"name": "calculator", ...}</tool_call>, the tool's answer, "#### <n>"),
#    70% answer at once without the tool: the warm start rarely calls it, and RL learns that calling it pays.
phase data python -m rlflow.data.tasks --task tool_product --digits 2 --direct-percent 70 --train 4000 --val 128 --overwrite \
  --seed "$SEED" --out "$OUT/data"

# 3. SFT warm start on the traces (loss on the assistant turns only). Copying the tool's answer into "#### <n>"
#    is learned late and abruptly (between 700 and 1050 steps at seed 0 on one machine, docs/agents.md), and
#    GRPO has nothing to reward before it: 1200 steps leave a margin.
phase sft env MODEL="$OUT/model" DATA="$OUT/data" OUT="$OUT/sft" STEPS="$SFT_STEPS" SEED="$SEED" \
  recipes/sft_tiny_cpu.sh data.max_length=192 trainer.save_freq=200 trainer.test_freq=200

# 4. GRPO with the tool loop: each trajectory is call -> calculator -> answer, tool tokens masked from the loss.
phase grpo env MODEL="$OUT/sft/hf" DATA="$OUT/data" OUT="$OUT/grpo" STEPS="$STEPS" SEED="$SEED" \
  recipes/grpo_tool_tiny_cpu.sh

# 5. The baseline: the same GRPO budget without tools (the same loop; every call is answered "unknown tool").
phase grpo_no_tools env MODEL="$OUT/sft/hf" DATA="$OUT/data" OUT="$OUT/grpo_no_tools" STEPS="$STEPS" SEED="$SEED" \
  TOOLS="[]" recipes/grpo_tool_tiny_cpu.sh trainer.experiment_name=grpo_no_tools_tiny

# 6. Report: greedy accuracy through the tool loop before SFT, after SFT and after GRPO; the curves; samples.md
#    with whole trajectories. The baseline's accuracy (without tools) is its own run's last validation.
cat "$OUT"/.done-{preset,data,sft,grpo,grpo_no_tools} > "$OUT/phase_times.tsv"
printf '\n==== [report]\n'
python -m rlflow.observability.report --out "$OUT" \
  --run sft="$OUT/sft" --run grpo="$OUT/grpo" --run grpo_no_tools="$OUT/grpo_no_tools" \
  --model before_sft="$OUT/model" --model after_sft="$OUT/sft/hf" --model after_grpo="$OUT/grpo/hf" \
  --data "$OUT/data/val.parquet" --max-new-tokens 128 --tools calculator --phase-times "$OUT/phase_times.tsv"
