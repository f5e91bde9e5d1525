#!/usr/bin/env bash
# GRPO across several machines (docs/multinode.md): the same main_ppo, joining a Ray cluster
# started with `ray start`. Run this on the head node once every node has joined:
#
#   # every node, same environment and the same paths to model and data:
#   export RAY_AUTH_MODE=disabled                         # private trusted network (or copy the auth token)
#   ray start --head --port=6379 --num-gpus=8             # head node
#   ray start --address=<head-ip>:6379 --num-gpus=8       # each other node
#   ray status                                            # lists every node
#
#   NNODES=2 PROCS_PER_NODE=8 MODEL=/models/Qwen2.5-0.5B-Instruct DATA=/data/gsm8k \
#     recipes/grpo_multinode.sh [overrides...]
#
# On CPU-only machines use --num-cpus instead of --num-gpus and PROCS_PER_NODE up to the cores.
# Workers are placed PROCS_PER_NODE per node (one STRICT_PACK group per node); rank 0's node IP
# is the torch.distributed rendezvous, so open the ports between the machines.
set -euo pipefail
MODEL=${MODEL:?set MODEL to an HF folder every node can read at this path}
DATA=${DATA:?set DATA to a folder with verl-format train.parquet and test.parquet}
NNODES=${NNODES:-2}
PROCS_PER_NODE=${PROCS_PER_NODE:-8}
OUT=${OUT:-outputs/grpo_multinode}              # checkpoints are written by the workers: use a shared file system

args=(
  algorithm=grpo actor.engine=fsdp2 ref.engine=fsdp2 rollout=vllm
  model=hf model.path="$MODEL"
  data.train_files="[$DATA/train.parquet]"
  data.val_files="[$DATA/test.parquet]"
  data.max_prompt_length=512
  data.max_response_length=1024
  data.filter_overlong_prompts=true
  data.train_batch_size=1024                    # prompts per step, split over NNODES x PROCS_PER_NODE ranks
  rollout.n=5
  rollout.dtype=bfloat16
  rollout.gpu_memory_utilization=0.5            # GPU: the KV cache is half the memory free once the actor is loaded
  actor.ppo_mini_batch_size=256
  actor.use_kl_loss=true actor.kl_loss_coef=0.001 actor.kl_loss_type=low_var_kl
  actor.engine.optimizer.lr=1e-6
  actor.engine.param_dtype=bfloat16
  actor.engine.gradient_checkpointing=true
  actor.engine.use_dynamic_bsz=true actor.engine.max_token_len_per_micro_batch=16384
  ref.engine.param_dtype=bfloat16
  trainer.ray_address=auto                      # join the running cluster instead of starting a local one
  trainer.nnodes="$NNODES"                      # Ray nodes to place workers on
  trainer.n_procs_per_node="$PROCS_PER_NODE"    # worker processes (GPUs) per node
  trainer.total_epochs=15
  trainer.test_freq=5
  trainer.save_freq=20
  trainer.logger="[console,jsonl,wandb]"
  trainer.default_local_dir="$OUT"
)
exec python -m rlflow.trainer.main_ppo "${args[@]}" "$@"
