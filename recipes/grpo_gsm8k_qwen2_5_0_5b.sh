#!/usr/bin/env bash
# GPU: GRPO on GSM8K with Qwen2.5-0.5B-Instruct on one node of 8 GPUs (verl's GSM8K example setup).
# FSDP2 actor and reference, CUDA vLLM rollout fused in one process per GPU (colocated placement);
# nothing is downloaded, so point it at local copies:
#
#   MODEL=/models/Qwen2.5-0.5B-Instruct DATA=/data/gsm8k recipes/grpo_gsm8k_qwen2_5_0_5b.sh [overrides...]
#
# MODEL  a local HF folder (Qwen2/Qwen3/Llama architectures)
# DATA   verl-format GSM8K parquet: train.parquet and test.parquet with data_source "openai/gsm8k",
#        prompt (chat messages) and reward_model.ground_truth; the built-in gsm8k reward scores the
#        "#### <answer>" line. Make them from a local copy of the openai/gsm8k files (docs/data.md):
#          rlflow-data gsm8k --src /data/raw/gsm8k/main --out /data/gsm8k
#        (verl's own examples/data_preprocess/gsm8k.py output works too).
# GPUS   GPUs on this node (default 8); OUT run folder (default outputs/grpo_gsm8k_qwen2_5_0_5b)
set -euo pipefail
MODEL=${MODEL:?set MODEL to a local Qwen2.5-0.5B-Instruct folder}
DATA=${DATA:?set DATA to a folder with verl-format GSM8K train.parquet and test.parquet}
GPUS=${GPUS:-8}
OUT=${OUT:-outputs/grpo_gsm8k_qwen2_5_0_5b}

args=(
  algorithm=grpo                                # group-relative advantages, no critic
  actor.engine=fsdp2 ref.engine=fsdp2 rollout=vllm
  model=hf model.path="$MODEL"
  data.train_files="[$DATA/train.parquet]"
  data.val_files="[$DATA/test.parquet]"
  data.max_prompt_length=512                    # GSM8K questions with the chat template fit in 512 tokens
  data.max_response_length=1024                 # room for the worked solution
  data.filter_overlong_prompts=true             # drop (and count) the few longer prompts at load time
  data.train_batch_size=1024                    # prompts per step
  rollout.n=5                                   # samples per prompt (the GRPO group)
  rollout.temperature=1.0
  rollout.dtype=bfloat16                        # vLLM weights and KV cache in bf16
  rollout.gpu_memory_utilization=0.5            # GPU: the KV cache is half the memory free once the actor is loaded
  rollout.free_cache_engine=true                # vLLM sleeps (frees its memory) while the actor trains
  rollout.max_num_seqs=1024
  actor.ppo_mini_batch_size=256                 # 4 optimizer steps per rollout batch
  actor.use_kl_loss=true                        # GRPO's KL(policy || reference) loss term
  actor.kl_loss_coef=0.001
  actor.kl_loss_type=low_var_kl
  actor.entropy_coeff=0.0
  actor.engine.optimizer.lr=1e-6
  actor.engine.param_dtype=bfloat16             # bf16 compute, fp32 master weights and optimizer state
  actor.engine.gradient_checkpointing=true
  actor.engine.use_dynamic_bsz=true             # micro-batches by token budget instead of a fixed count
  actor.engine.max_token_len_per_micro_batch=16384
  ref.engine.param_dtype=bfloat16
  ref.engine.use_dynamic_bsz=true
  ref.engine.max_token_len_per_micro_batch=32768
  trainer.device=cuda                           # a GPU recipe: bf16 compute (a CPU without native bf16 refuses it)
  trainer.n_procs_per_node="$GPUS"              # one worker process per GPU
  trainer.total_epochs=15
  trainer.test_freq=5
  trainer.save_freq=20
  trainer.max_ckpt_to_keep=2
  trainer.project_name=rlflow_gsm8k
  trainer.experiment_name=qwen2_5_0_5b_grpo
  trainer.logger="[console,jsonl,wandb]"
  trainer.default_local_dir="$OUT"
)
exec python -m rlflow.trainer.main_ppo "${args[@]}" "$@"
