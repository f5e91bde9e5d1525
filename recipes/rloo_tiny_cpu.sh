#!/usr/bin/env bash
# RLOO on the tiny preset from an SFT warm start (CPU, 30 steps: 6-8 min): recipes/grpo_tiny_cpu.sh with
# algorithm=rloo. Each sample's baseline is the mean reward of the other n-1 samples of its
# prompt (leave-one-out), with no division by the group's std. Same inputs (MODEL, DATA, OUT,
# STEPS, SEED) and extra Hydra overrides as grpo_tiny_cpu.sh; output in outputs/rloo_tiny.
set -euo pipefail
ALGORITHM=rloo exec "$(dirname "$0")/grpo_tiny_cpu.sh" "$@"
