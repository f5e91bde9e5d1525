#!/usr/bin/env bash
# GRPO with LoRA on the tiny preset from an SFT warm start (CPU): recipes/grpo_tiny_cpu.sh with the actor
# training rank-16 adapters on every attention and MLP linear layer instead of all its weights.
# The reference is the actor with its adapters off (no second model), and the rollout receives the
# merged weights after every update (docs/lora.md). LoRA's learning rate is 10x full fine-tuning's.
# Same inputs (MODEL, DATA, OUT, STEPS, SEED, ENGINE: fsdp2 or fsdp) and extra Hydra overrides as
# grpo_tiny_cpu.sh; output in outputs/grpo_lora_tiny (the adapters alone in its adapter/ folder).
set -euo pipefail
OUT=${OUT:-outputs/grpo_lora_tiny}
export OUT
exec "$(dirname "$0")/grpo_tiny_cpu.sh" \
  actor.engine.lora.rank=16 \
  actor.engine.lora.alpha=32 \
  actor.engine.lora.target_modules="[all-linear]" \
  actor.engine.lora.parts="[attention,mlp]" \
  actor.engine.optimizer.lr=2e-3 \
  trainer.export_lora_adapter_dir="$OUT/adapter" \
  "$@"
