#!/usr/bin/env bash
# PPO with GAE and a critic on the tiny preset from an SFT warm start (CPU, 30 steps: about 10 min):
# recipes/grpo_tiny_cpu.sh with algorithm=ppo plus the critic's settings below. The critic is a
# value head on the same warm-start model (its own FSDP2 engine in the same Ray worker group),
# trained with the clipped value loss on GAE returns (lam 0.95). Same inputs (MODEL, DATA, OUT,
# STEPS, SEED) as grpo_tiny_cpu.sh; output in outputs/ppo_tiny.
#
#   recipes/ppo_tiny_cpu.sh [extra Hydra overrides...]
set -euo pipefail
critic=(
  critic.ppo_mini_batch_size=64                 # prompts per critic optimizer step (x rollout.n sequences)
  critic.engine.micro_batch_size=256            # sequences per critic forward/backward
  critic.engine.optimizer.lr=1e-3               # the freshly initialised value head needs a high rate
  critic.warmup_steps=0                         # >0: the first steps train only the critic
)
ALGORITHM=ppo exec "$(dirname "$0")/grpo_tiny_cpu.sh" "${critic[@]}" "$@"
