#!/usr/bin/env bash
# REINFORCE++ on the tiny preset from an SFT warm start (CPU, 30 steps: 6-8 min): recipes/grpo_tiny_cpu.sh
# with algorithm=reinforce_pp. Token-level discounted returns (gamma 1.0 here), whitened over the
# whole batch instead of per prompt group. Same inputs (MODEL, DATA, OUT, STEPS, SEED) and extra
# Hydra overrides as grpo_tiny_cpu.sh; output in outputs/reinforce_pp_tiny.
set -euo pipefail
ALGORITHM=reinforce_pp exec "$(dirname "$0")/grpo_tiny_cpu.sh" "$@"
