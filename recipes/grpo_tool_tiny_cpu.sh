#!/usr/bin/env bash
# GRPO with the calculator tool: the tiny preset, the tool_product task, multi-turn tool_agent trajectories
# on the request-level vLLM rollout, from an SFT warm start on tool-call traces (CPU; docs/agents.md).
#
#   recipes/grpo_tool_tiny_cpu.sh [extra Hydra overrides...]
#
# Inputs (environment): MODEL  warm-start HF folder           (default outputs/demo_agent/sft/hf)
#                       DATA   task folder with train/val.parquet (default outputs/demo_agent/data)
#                       OUT    run folder                     (default outputs/grpo_tool_tiny)
#                       STEPS  GRPO steps                     (default 20)
#                       SEED   seed of data order, sampling and the engine (default 0)
#                       TOOLS  the tools the tool_agent loop offers (default [calculator]); [] is the no-tools
#                              baseline: the same loop and budget, every call answered "unknown tool"
# Run from the repository root; make the inputs with `make demo-agent` (or its first three phases).
set -euo pipefail
MODEL=${MODEL:-outputs/demo_agent/sft/hf}
DATA=${DATA:-outputs/demo_agent/data}
OUT=${OUT:-outputs/grpo_tool_tiny}
STEPS=${STEPS:-20}
SEED=${SEED:-0}
TOOLS=${TOOLS:-[calculator]}
export WANDB_MODE=${WANDB_MODE:-offline}

args=(
  algorithm=grpo                                # group-relative advantages, no critic
  actor.engine=fsdp2 ref.engine=fsdp2           # the actor and the reference, fused in one Ray worker process
  actor.use_kl_loss=true actor.kl_loss_coef=0.001 actor.kl_loss_type=low_var_kl
  rollout=vllm                                  # in-process vLLM replica per worker, driven per request
  rollout.multi_turn.enable=true                # each row runs its agent_name loop (tool_agent for this task)
  rollout.multi_turn.tools="$TOOLS"             # the tool the model calls: safe arithmetic, no eval
  rollout.multi_turn.max_assistant_turns=3      # call, read, answer (one spare turn)
  model=hf model.path="$MODEL"
  data.train_files="[$DATA/train.parquet]"
  data.val_files="[$DATA/val.parquet]"
  data.max_prompt_length=64                     # the task's prompts are 44 tokens
  data.max_response_length=128                  # the whole trajectory: call (~75 tokens), tool turn, answer
  data.train_batch_size=32                      # prompts per step
  data.seed="$SEED"
  rollout.n=8                                   # samples per prompt: the GRPO group
  rollout.temperature=1.0
  rollout.seed="$SEED"
  rollout.calculate_log_probs=true              # the train/inference mismatch metrics
  actor.ppo_mini_batch_size=32                  # one on-policy optimizer step per rollout batch (256 trajectories)
  actor.engine.micro_batch_size=128
  ref.engine.micro_batch_size=128
  actor.engine.optimizer.lr=2e-4
  actor.engine.seed="$SEED"
  trainer.total_training_steps="$STEPS"
  trainer.test_freq=5                           # greedy val accuracy (through the tool loop) every 5 steps
  trainer.save_freq=10
  trainer.resume_mode=auto
  trainer.seed="$SEED"
  trainer.logger="[console,jsonl,wandb]"
  trainer.experiment_name=grpo_tool_tiny
  trainer.default_local_dir="$OUT"
)
exec python -m rlflow.trainer.main_ppo "${args[@]}" "$@"
