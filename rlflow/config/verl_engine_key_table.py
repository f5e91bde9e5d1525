"""The engine rows of the verl -> rlflow key table: written once, expanded under every engine mount.

A generic row is ``(verl suffix, rlflow suffix under <mount>, note)``; verl's side sits under the
role's ``optim.`` (``OPTIM_ROWS``), ``fsdp_config.`` (``FSDP_ROWS``) or ``megatron.``
(``MEGATRON_ROWS``) prefix, rlflow's under the role's engine node (``actor.engine``). A verl suffix
ending in ``.*`` covers every key below it. ``engine_rows`` writes them out for one
``EngineMount``; ``rlflow.config.verl_key_table`` holds the rest of the table.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

Row = tuple[Optional[str], Optional[str], str]

NO_OPTIMIZER = "not used: this role never takes an optimizer step"
NOT_MEGATRON_MOE = "rlflow's megatron engine runs dense models (llama, qwen2, qwen3 families): no expert parallelism"
ULYSSES = ("fsdp, fsdp2 with attn_implementation=sdpa_varlen or flash attention; max_token_len_per_micro_batch "
           "counts the whole micro-batch (verl's per-GPU budget times this)")
HF_WEIGHTS = "rlflow's megatron engine loads the HF folder (model.path) and converts it itself; its checkpoints are its own"

OPTIM_ROWS: list[Row] = [
    ("lr", "optimizer.lr", ""),
    ("betas", "optimizer.betas", ""),
    (None, "optimizer.eps", ""),
    ("weight_decay", "optimizer.weight_decay", "rlflow decays matrices and embeddings only, never biases or norm weights"),
    ("clip_grad", "optimizer.grad_clip", "<= 0 measures the norm without clipping"),
    (None, "optimizer.implementation", "AdamW's kernels: foreach (default) | fused | for-loop; verl passes them in override_optimizer_config"),
    ("lr_scheduler_type", "lr_scheduler.name", "constant | cosine as in verl, plus linear"),
    ("warmup_style", "lr_scheduler.name", "verl's older name of lr_scheduler_type"),
    ("lr_decay_style", "lr_scheduler.name", "verl's Megatron optimizer name: constant | linear | cosine"),
    ("lr_warmup_steps", "lr_scheduler.warmup_steps", "in optimizer steps; verl's -1 (use the ratio) is left out"),
    ("lr_warmup_steps_ratio", "lr_scheduler.warmup_steps", "rlflow-from-verl converts the ratio to optimizer steps when "
                                                           "the run's length is known; otherwise give warmup_steps"),
    ("lr_warmup_init", None, "warmup starts at lr / warmup_steps and rises linearly to lr"),
    ("min_lr_ratio", "lr_scheduler.min_lr_ratio", ""),
    ("min_lr", "lr_scheduler.min_lr_ratio", "as a ratio: rlflow-from-verl divides min_lr by lr"),
    ("total_training_steps", "lr_scheduler.total_steps", "0 (verl: -1): filled in from the run's length"),
    ("num_cycles", None, "rlflow's cosine decays once, from lr to min_lr_ratio * lr"),
    ("optimizer", None, "AdamW only"),
    ("optimizer_impl", None, "torch.optim.AdamW only"),
    ("override_optimizer_config", None, "AdamW only"),
    ("override_optimizer_config.*", None, "AdamW only; optimizer state offload is the engine's optimizer_offload"),
]
FSDP_ROWS: list[Row] = [
    ("strategy", "name", "fsdp | fsdp2 | a registered engine; pick it with <role>.engine=NAME"),
    ("model_dtype", "dtype", "master weights and optimizer state"),
    ("dtype", "param_dtype", "the compute dtype (mixed precision with dtype float32)"),
    ("mixed_precision.param_dtype", "param_dtype", "the compute dtype"),
    ("mixed_precision.reduce_dtype", "reduce_dtype", ""),
    ("mixed_precision.buffer_dtype", None, "buffers (rotary tables) follow the model's own dtype"),
    (None, "device", "auto | cpu | cuda"),
    ("param_offload", "param_offload", ""),
    ("optimizer_offload", "optimizer_offload", ""),
    ("reshard_after_forward", "reshard_after_forward", "fsdp2 engine only"),
    (None, "defer_grad_reduce", "fsdp2 engine only: one gradient reduce-scatter per mini-batch"),
    ("forward_prefetch", "forward_prefetch", "fsdp engine only"),
    (None, "sharding_strategy", "fsdp engine only: FULL_SHARD | SHARD_GRAD_OP | NO_SHARD"),
    ("fsdp_size", "hybrid_replicate_size", "inverse view: verl names the shard group size, rlflow the number of "
                                           "replicas (HSDP, fsdp2 engine); world = replicas x shard size"),
    ("wrap_policy.min_num_params", None, "rlflow wraps by class (<engine>.wrap_layer_classes; default: the model's "
                                         "_no_split_modules), not by parameter count"),
    (None, "wrap_layer_classes", "classes sharded one unit per instance; []: the model's _no_split_modules"),
    ("seed", "seed", "rank r uses seed + r"),
    ("offload_policy", None, "param_offload / optimizer_offload"),
    ("use_orig_params", None, "the fsdp engine always uses use_orig_params=True"),
    ("ulysses_sequence_parallel_size", "ulysses_sequence_parallel_size", ULYSSES),
    ("use_torch_compile", "compile", "fsdp2 and torchtitan engines: torch.compile of each decoder layer (verl: of "
                                     "its entropy function); fsdp2: auto (on a CPU for runs of 500 steps or more), "
                                     "torchtitan: off (verl: on)"),
    ("full_determinism", None, "seeded runs reproduce by default (docs/reliability.md)"),
]
MEGATRON_ROWS: list[Row] = [
    ("tensor_model_parallel_size", "tensor_model_parallel_size", "megatron engine (<role>.engine=megatron)"),
    ("pipeline_model_parallel_size", "pipeline_model_parallel_size", "megatron engine; it must divide the layer count"),
    ("param_offload", "param_offload", ""),
    ("optimizer_offload", "optimizer_offload", ""),
    ("use_distributed_optimizer", "use_distributed_optimizer", "AdamW's state sharded over data parallelism (rlflow's "
                                                               "own; false by default, verl: true)"),
    ("grad_offload", None, "param_offload moves the gradient buffers with the parameters"),
    ("seed", "seed", ""),
    ("virtual_pipeline_model_parallel_size", None, "no interleaved schedule: one model chunk per pipeline stage"),
    ("context_parallel_size", None, "no context parallelism"),
    ("sequence_parallel", "sequence_parallel", "megatron engine, with tensor_model_parallel_size > 1"),
    ("expert_model_parallel_size", None, NOT_MEGATRON_MOE),
    ("expert_tensor_parallel_size", None, NOT_MEGATRON_MOE),
    ("use_dist_checkpointing", None, HF_WEIGHTS),
    ("dist_checkpointing_path", None, HF_WEIGHTS),
    ("use_mbridge", None, HF_WEIGHTS),
    ("vanilla_mbridge", None, HF_WEIGHTS),
    ("override_transformer_config.bias_activation_fusion", "bias_activation_fusion", "megatron's fused SwiGLU"),
    ("override_transformer_config.recompute_granularity", "gradient_checkpointing",
     "full: true, every decoder layer recomputed (verl's recompute_method=uniform, recompute_num_layers=1)"),
    ("override_transformer_config.*", None, "the TransformerConfig comes from the HF config.json; rlflow sets no other "
                                            "fusions, recompute schedules or MoE options"),
]
# rlflow engine keys every mount has that no verl key sets.
RLFLOW_ONLY_ENGINE_KEYS: list[tuple[str, str]] = [
    ("forward_micro_batch_size", "forward-only passes (log-probs, values, scores); null: micro_batch_size"),
    ("forward_use_dynamic_bsz", "null: use_dynamic_bsz"),
    ("forward_max_token_len_per_micro_batch", "null: max_token_len_per_micro_batch"),
    ("attn_implementation", "auto | sdpa | sdpa_varlen | eager | flash_attention_2 | flex_attention "
                            "(auto: sdpa_varlen on a CPU)"),
    ("logprob_chunk_size", "tokens per chunk of the log-prob computation"),
    ("share_prefix", "compute a prefix rows share (a GRPO group's prompt) once; needs sdpa_varlen "
                     "(auto: on a CPU when rollout.n > 1)"),
    ("trust_remote_code", "defaults to model.trust_remote_code"),
    ("make_vocab_size_divisible_by", "megatron engine: the vocabulary padding"),
    ("lora.rank", "LoRA adapter rank; 0: full fine-tuning (docs/lora.md)"),
    ("lora.alpha", "adapter scale alpha / rank"),
    ("lora.dropout", ""),
    ("lora.target_modules", "all-linear or module names"),
    ("lora.parts", "attention | mlp | unembedding: what all-linear covers"),
    ("lora.adapter_path", "a peft adapter folder to start from"),
]


class EngineMount(NamedTuple):
    """Where one role's engine keys live: rlflow's engine node, and verl's prefixes for them (None: verl has no
    such keys there; ``optim`` None: the role never takes an optimizer step)."""

    node: str
    optim: Optional[str]
    fsdp: Optional[str]
    megatron: Optional[str] = None


GENERIC_ROWS = (("optim", OPTIM_ROWS), ("fsdp", FSDP_ROWS), ("megatron", MEGATRON_ROWS))


def engine_rows(mount: EngineMount) -> list[Row]:
    """The generic engine rows written out for one mount."""
    node = mount.node
    if mount.optim is None:
        rows: list[Row] = [(None, f"{node}.{ours}", NO_OPTIMIZER)
                           for ours in dict.fromkeys(ours for _, ours, _ in OPTIM_ROWS if ours is not None)]
    else:
        rows = [(None if verl is None else mount.optim + verl, None if ours is None else f"{node}.{ours}", note)
                for verl, ours, note in OPTIM_ROWS]
    for prefix, generic in GENERIC_ROWS[1:]:
        verl_prefix = getattr(mount, prefix)
        for verl, ours, note in generic:
            verl_key = None if verl is None or verl_prefix is None else verl_prefix + verl
            if (ours is not None and prefix == "fsdp") or verl_key is not None:
                rows.append((verl_key, None if ours is None else f"{node}.{ours}", note))
    return rows + [(None, f"{node}.{ours}", note) for ours, note in RLFLOW_ONLY_ENGINE_KEYS]
