"""The data of the verl -> rlflow key translation (``rlflow.config.verl_keys`` reads it; docs/from_verl_keys.md shows it).

A row is ``(verl key or None, rlflow key or None, note)``: None on the verl side is an rlflow key
verl has no name for, None on the rlflow side a verl key rlflow has no equivalent for (the note
says why, or what to do instead). Keys were read from verl's ``ppo_trainer.yaml`` (its generated,
fully expanded form) and ``sft_trainer.yaml``. The four engine mounts share one set of rows,
written once (``OPTIM_ROWS``, ``FSDP_ROWS``) and expanded per mount by ``engine_rows``.
"""

from __future__ import annotations

from typing import Optional

Row = tuple[Optional[str], Optional[str], str]

NO_OPTIMIZER = "not used: this role never takes an optimizer step"

# (verl suffix, rlflow suffix under <mount>.engine., note); verl's side is under the role's optim. / fsdp_config.
OPTIM_ROWS: list[tuple[Optional[str], Optional[str], str]] = [
    ("lr", "optimizer.lr", ""),
    ("betas", "optimizer.betas", ""),
    (None, "optimizer.eps", ""),
    ("weight_decay", "optimizer.weight_decay", "rlflow decays matrices and embeddings only, never biases or norm weights"),
    ("clip_grad", "optimizer.grad_clip", "<= 0 measures the norm without clipping"),
    (None, "optimizer.implementation", "AdamW's kernels: foreach (default) | fused | for-loop; verl passes them in override_optimizer_config"),
    ("lr_scheduler_type", "lr_scheduler.name", "constant | cosine as in verl, plus linear"),
    ("warmup_style", "lr_scheduler.name", "verl's older name of lr_scheduler_type"),
    ("lr_warmup_steps", "lr_scheduler.warmup_steps", "verl's -1 (use the ratio) has no rlflow form: give steps"),
    ("lr_warmup_steps_ratio", None, "give lr_scheduler.warmup_steps in optimizer steps"),
    ("min_lr_ratio", "lr_scheduler.min_lr_ratio", ""),
    ("total_training_steps", "lr_scheduler.total_steps", "0 (verl: -1): filled in from the run's length"),
    ("num_cycles", None, "rlflow's cosine decays once, from lr to min_lr_ratio * lr"),
    ("optimizer", None, "AdamW only"),
    ("optimizer_impl", None, "torch.optim.AdamW only"),
    ("override_optimizer_config", None, "AdamW only"),
]
FSDP_ROWS: list[tuple[Optional[str], Optional[str], str]] = [
    ("strategy", "name", "fsdp | fsdp2 | a registered engine; pick it with <role>.engine=NAME"),
    ("model_dtype", "dtype", "master weights and optimizer state"),
    ("dtype", "param_dtype", "the compute dtype (mixed precision with dtype float32)"),
    (None, "reduce_dtype", ""),
    (None, "device", "auto | cpu | cuda"),
    ("param_offload", "param_offload", ""),
    ("optimizer_offload", "optimizer_offload", ""),
    ("reshard_after_forward", "reshard_after_forward", "fsdp2 engine only"),
    (None, "defer_grad_reduce", "fsdp2 engine only: one gradient reduce-scatter per mini-batch"),
    ("forward_prefetch", "forward_prefetch", "fsdp engine only"),
    (None, "sharding_strategy", "fsdp engine only: FULL_SHARD | SHARD_GRAD_OP | NO_SHARD"),
    ("fsdp_size", "hybrid_replicate_size", "inverse view: verl names the shard group size, rlflow the number of "
                                           "replicas (HSDP, fsdp2 engine); world = replicas x shard size"),
    ("wrap_policy.min_num_params", "wrap_layer_classes", "rlflow wraps by class (default: the model's "
                                                          "_no_split_modules), not by parameter count"),
    ("seed", "seed", "rank r uses seed + r"),
    ("offload_policy", None, "param_offload / optimizer_offload"),
    ("use_orig_params", None, "the fsdp engine always uses use_orig_params=True"),
    ("ulysses_sequence_parallel_size", None, "no sequence parallelism"),
    ("use_torch_compile", "compile", "fsdp2 and torchtitan engines: torch.compile of each decoder layer (verl: of "
                                     "its entropy function); off by default (verl: on)"),
    ("full_determinism", None, "seeded runs reproduce by default (docs/reliability.md)"),
]
# rlflow engine keys every mount has that no verl key sets.
RLFLOW_ONLY_ENGINE_KEYS: list[tuple[str, str]] = [
    ("attn_implementation", "sdpa | sdpa_varlen | eager | flash_attention_2 | flex_attention"),
    ("logprob_chunk_size", "tokens per chunk of the log-prob computation"),
    ("share_prefix", "compute a prefix rows share (a GRPO group's prompt) once; needs sdpa_varlen"),
    ("trust_remote_code", "defaults to model.trust_remote_code"),
    ("lora.rank", "LoRA adapter rank; 0: full fine-tuning (docs/lora.md)"),
    ("lora.alpha", "adapter scale alpha / rank"),
    ("lora.dropout", ""),
    ("lora.target_modules", "all-linear or module names"),
    ("lora.parts", "attention | mlp | unembedding: what all-linear covers"),
    ("lora.adapter_path", "a peft adapter folder to start from"),
]


# An engine mount: (rlflow's engine node, verl's optimizer prefix or None: the role takes no optimizer
# step, verl's fsdp_config prefix or None: verl has no such keys there).
EngineMount = tuple[str, Optional[str], Optional[str]]


def engine_rows(mount: EngineMount) -> list[Row]:
    """The generic engine rows written out for one mount."""
    node, optim, fsdp = mount
    if optim is None:
        rows: list[Row] = [(None, f"{node}.{ours}", NO_OPTIMIZER)
                           for ours in dict.fromkeys(ours for _, ours, _ in OPTIM_ROWS if ours is not None)]
    else:
        rows = [(None if verl is None else optim + verl, None if ours is None else f"{node}.{ours}", note)
                for verl, ours, note in OPTIM_ROWS]
    for verl, ours, note in FSDP_ROWS:
        verl_key = None if verl is None or fsdp is None else fsdp + verl
        if ours is not None or verl_key is not None:
            rows.append((verl_key, None if ours is None else f"{node}.{ours}", note))
    return rows + [(None, f"{node}.{ours}", note) for ours, note in RLFLOW_ONLY_ENGINE_KEYS]


def _micro_batch_rows(mount: str, verl_prefix: str, verl_micro: str) -> list[Row]:
    return [
        (f"{verl_prefix}{verl_micro}", f"{mount}.engine.micro_batch_size", "sequences per forward/backward, per worker process"),
        (f"{verl_prefix}use_dynamic_bsz", f"{mount}.engine.use_dynamic_bsz", ""),
        (f"{verl_prefix}ppo_max_token_len_per_gpu", f"{mount}.engine.max_token_len_per_micro_batch", ""),
    ]


ACTOR = "actor_rollout_ref.actor."
ROLLOUT = "actor_rollout_ref.rollout."
MODEL = "actor_rollout_ref.model."

PPO_SECTIONS: list[tuple[str, list[Row]]] = [
    ("model (verl: actor_rollout_ref.model)", [
        (f"{MODEL}path", "model.path", "every role and the rollout load it; null: the tiny preset"),
        (None, "model.preset", "an rlflow preset built on first use"),
        (None, "model.preset_seed", ""),
        (f"{MODEL}tokenizer_path", "model.tokenizer_path", ""),
        ("data.tokenizer", "model.tokenizer_path", ""),
        (f"{MODEL}trust_remote_code", "model.trust_remote_code", "inherited by every engine and the rollout"),
        (f"{MODEL}external_lib", "trainer.external_lib", "merged into trainer.plugins"),
        (f"{MODEL}enable_gradient_checkpointing", "actor.engine.gradient_checkpointing", "per engine"),
        (f"{MODEL}use_remove_padding", "actor.engine.use_remove_padding", "per engine; on by default"),
        (f"{MODEL}override_config", None, "edit the model folder's config.json"),
        (f"{MODEL}custom_chat_template", None, "set chat_template in the tokenizer folder"),
        (f"{MODEL}lora_rank", "actor.engine.lora.rank", "the reference is then the actor with its adapters off"),
        (f"{MODEL}lora_alpha", "actor.engine.lora.alpha", ""),
        (f"{MODEL}target_modules", "actor.engine.lora.target_modules", "all-linear or module names"),
        (f"{MODEL}lora_adapter_path", "actor.engine.lora.adapter_path", "a peft adapter folder"),
        (f"{MODEL}use_liger", None, "no Liger kernels"),
        (f"{MODEL}use_fused_kernels", None, "no fused kernels"),
        (f"{MODEL}enable_activation_offload", None, "gradient_checkpointing only"),
        (f"{MODEL}use_shm", None, "loads from the filesystem"),
        ("actor_rollout_ref.hybrid_engine", "trainer.placement", "colocated is verl's hybrid engine; split gives each role its own pool"),
    ]),
    ("data", [
        ("data.train_files", "data.train_files", "a list of parquet/jsonl files or folders"),
        ("data.val_files", "data.val_files", ""),
        ("data.prompt_key", "data.prompt_key", ""),
        ("data.max_prompt_length", "data.max_prompt_length", ""),
        ("data.max_response_length", "data.max_response_length", ""),
        ("data.train_batch_size", "data.train_batch_size", ""),
        ("data.val_batch_size", "data.val_batch_size", ""),
        ("data.truncation", "data.truncation", "error | left | right | filter"),
        ("data.filter_overlong_prompts", "data.filter_overlong_prompts", ""),
        ("data.shuffle", "data.shuffle", ""),
        ("data.seed", "data.seed", "verl's default null, rlflow's 0"),
        ("data.apply_chat_template_kwargs", "data.apply_chat_template_kwargs", ""),
        ("data.reward_fn_key", None, "the reward is always looked up by data_source"),
        ("data.return_raw_chat", None, "the raw chat is always kept (raw_prompt)"),
        ("data.train_max_samples", None, "cut the file instead"),
        ("data.val_max_samples", None, "cut the file instead"),
        ("data.dataloader_num_workers", None, "prompts are tokenized once at start-up"),
        ("data.filter_overlong_prompts_workers", None, "filtering runs in the driver"),
        ("data.custom_cls.path", None, "no custom dataset class"),
        ("data.validation_shuffle", None, "validation is never shuffled"),
    ]),
    ("actor (verl: actor_rollout_ref.actor)", [
        (f"{ACTOR}ppo_mini_batch_size", "actor.ppo_mini_batch_size", "in prompts, as in verl"),
        (f"{ACTOR}ppo_epochs", "actor.ppo_epochs", ""),
        (f"{ACTOR}shuffle", "actor.shuffle", "verl's default false, rlflow's true"),
        (None, "actor.recompute_old_log_probs", "verl always recomputes; rlflow's auto reuses the update's forward when exactly on-policy"),
        (f"{ACTOR}clip_ratio", "actor.clip_ratio", ""),
        (f"{ACTOR}clip_ratio_low", "actor.clip_ratio_low", "null: clip_ratio"),
        (f"{ACTOR}clip_ratio_high", "actor.clip_ratio_high", "null: clip_ratio"),
        (f"{ACTOR}clip_ratio_c", "actor.clip_ratio_c", ""),
        (f"{ACTOR}tau_pos", "actor.tau_pos", ""),
        (f"{ACTOR}tau_neg", "actor.tau_neg", ""),
        (f"{ACTOR}loss_agg_mode", "actor.loss_agg_mode", ""),
        (f"{ACTOR}entropy_coeff", "actor.entropy_coeff", ""),
        (f"{ACTOR}use_kl_loss", "actor.use_kl_loss", ""),
        (f"{ACTOR}kl_loss_coef", "actor.kl_loss_coef", ""),
        (f"{ACTOR}kl_loss_type", "actor.kl_loss_type", ""),
        *((f"{ACTOR}policy_loss.{key}", f"actor.policy_loss.{key}", "")
          for key in ("loss_mode", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")),
        (f"{ACTOR}grad_clip", "actor.engine.optimizer.grad_clip", ""),
        (f"{ACTOR}ppo_micro_batch_size", None, "deprecated in verl: actor.engine.micro_batch_size is per process"),
        (f"{ACTOR}data_loader_seed", None, "mini-batches are shuffled from trainer.seed + step"),
        (f"{ACTOR}ulysses_sequence_parallel_size", None, "no sequence parallelism"),
        (f"{ACTOR}checkpoint.save_contents", None, "a checkpoint always holds model, optimizer and extra state"),
        *_micro_batch_rows("actor", ACTOR, "ppo_micro_batch_size_per_gpu"),
        (f"{ACTOR}strategy", "actor.engine.name", "fsdp | fsdp2 | a registered engine"),
        (f"{ROLLOUT}log_prob_micro_batch_size_per_gpu", "actor.engine.micro_batch_size", "old log-probs come from the actor engine"),
    ]),
    ("critic", [
        ("critic.ppo_mini_batch_size", "critic.ppo_mini_batch_size", "rlflow does not inherit the actor's"),
        ("critic.ppo_epochs", "critic.ppo_epochs", ""),
        ("critic.shuffle", "critic.shuffle", ""),
        ("critic.cliprange_value", "critic.cliprange_value", ""),
        ("critic.loss_agg_mode", "critic.loss_agg_mode", ""),
        ("trainer.critic_warmup", "critic.warmup_steps", ""),
        ("critic.enable", None, "a critic runs exactly when the advantage estimator needs values (gae)"),
        ("critic.model.path", "critic.model.path", "null: the actor's model.path"),
        ("critic.model.tokenizer_path", "model.tokenizer_path", "one tokenizer for the run"),
        ("critic.model.enable_gradient_checkpointing", "critic.engine.gradient_checkpointing", ""),
        ("critic.model.use_remove_padding", "critic.engine.use_remove_padding", ""),
        ("critic.ppo_micro_batch_size_per_gpu", "critic.engine.micro_batch_size", ""),
        ("critic.forward_micro_batch_size_per_gpu", "critic.engine.micro_batch_size", "one micro-batch size for forward and update"),
        ("critic.use_dynamic_bsz", "critic.engine.use_dynamic_bsz", ""),
        ("critic.ppo_max_token_len_per_gpu", "critic.engine.max_token_len_per_micro_batch", ""),
        ("critic.grad_clip", "critic.engine.optimizer.grad_clip", ""),
        ("critic.strategy", "critic.engine.name", ""),
    ]),
    ("reference (verl: actor_rollout_ref.ref)", [
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "ref.engine.micro_batch_size", ""),
        ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "ref.engine.use_dynamic_bsz", ""),
        ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "ref.engine.max_token_len_per_micro_batch", ""),
        ("actor_rollout_ref.ref.strategy", "ref.engine.name", ""),
        (None, "ref.engine.gradient_checkpointing", "no backward pass: leave false"),
        (None, "ref.engine.use_remove_padding", ""),
    ]),
    ("rollout (verl: actor_rollout_ref.rollout)", [
        (f"{ROLLOUT}name", "rollout.name", "vllm | hf (no sglang)"),
        (f"{ROLLOUT}prompt_length", "rollout.prompt_length", ""),
        (f"{ROLLOUT}response_length", "rollout.response_length", ""),
        (f"{ROLLOUT}n", "rollout.n", "verl's default 1, rlflow's 4"),
        *((f"{ROLLOUT}{key}", f"rollout.{key}", "") for key in ("temperature", "top_p", "top_k", "do_sample")),
        (None, "rollout.seed", "seeds every request from (seed, step, replica, row, sample)"),
        (None, "rollout.stop", "stop strings"),
        (f"{ROLLOUT}logprobs_mode", "rollout.logprobs_mode", ""),
        (f"{ROLLOUT}dtype", "rollout.dtype", "verl's default bfloat16, rlflow's float32"),
        (f"{ROLLOUT}max_model_len", "rollout.max_model_len", ""),
        (f"{ROLLOUT}max_num_seqs", "rollout.max_num_seqs", ""),
        (f"{ROLLOUT}enforce_eager", "rollout.enforce_eager", ""),
        (f"{ROLLOUT}enable_prefix_caching", "rollout.enable_prefix_caching", ""),
        (None, "rollout.kv_cache_space_gb", "vLLM's KV cache in GiB (CPU needs it)"),
        (f"{ROLLOUT}gpu_memory_utilization", "rollout.gpu_memory_utilization", ""),
        (f"{ROLLOUT}tensor_model_parallel_size", "rollout.tensor_parallel_size", "only 1 today"),
        (f"{ROLLOUT}free_cache_engine", "rollout.free_cache_engine", ""),
        (None, "rollout.weight_sync_bucket_mb", ""),
        (None, "rollout.lora_sync", "a LoRA actor's sync: merged | adapter"),
        (None, "rollout.lora_rank", "the actor's lora.rank (interpolated)"),
        (None, "rollout.prompt_overflow", ""),
        (None, "rollout.num_replicas", "a split rollout pool of this many processes"),
        (f"{ROLLOUT}engine_kwargs.vllm", "rollout.engine_kwargs", "vllm.LLM(...) arguments, not nested under vllm"),
        (None, "rollout.trust_remote_code", "defaults to model.trust_remote_code"),
        *((f"{ROLLOUT}val_kwargs.{key}", f"rollout.val_kwargs.{key}", "")
          for key in ("n", "temperature", "top_p", "top_k", "do_sample")),
        *((None, f"rollout.val_kwargs.{key}", "") for key in ("seed", "stop", "max_new_tokens")),
        (f"{ROLLOUT}mode", None, "one in-process engine per rollout worker (no async server)"),
        (f"{ROLLOUT}max_num_batched_tokens", None, "pass it in rollout.engine_kwargs"),
        (f"{ROLLOUT}enable_chunked_prefill", None, "pass it in rollout.engine_kwargs"),
        (f"{ROLLOUT}load_format", None, "weights always come from the actor at the first sync"),
        (f"{ROLLOUT}calculate_log_probs", None, "rollout_log_probs are always returned"),
        (f"{ROLLOUT}ignore_eos", None, "generation stops at EOS"),
        (f"{ROLLOUT}data_parallel_size", None, "rollout.num_replicas"),
        (f"{ROLLOUT}over_sample_rate", None, "no over-sampling"),
        (f"{ROLLOUT}multi_stage_wake_up", None, "free_cache_engine sleeps and wakes the whole engine"),
    ]),
    ("algorithm", [
        *((f"algorithm.{key}", f"algorithm.{key}", "") for key in (
            "adv_estimator", "gamma", "lam", "norm_adv_by_std_in_grpo", "use_kl_in_reward", "kl_penalty",
            "kl_ctrl.type", "kl_ctrl.kl_coef", "kl_ctrl.target_kl", "kl_ctrl.horizon")),
        ("algorithm.use_pf_ppo", None, "no PF-PPO reweighting"),
    ]),
    ("reward (verl: custom_reward_function, reward_model)", [
        ("custom_reward_function.path", "reward.custom_function", "one key, path.py:fn or package.module:fn"),
        ("custom_reward_function.name", "reward.custom_function", "the part after the colon"),
        (None, "reward.num_workers", "score in worker processes"),
        (None, "reward.error_score", "score of a sample whose reward function failed"),
        (None, "reward.max_error_fraction", "stop the run when more of a batch failed"),
        ("reward_model.enable", "reward.reward_model.enable", ""),
        (None, "reward.combine", "replace: the reward model's score alone (verl's behaviour); add: rule reward + it"),
        (None, "reward.rm_weight", "the reward model score's weight"),
        ("reward_model.model.path", "reward.reward_model.path", ""),
        ("reward_model.strategy", "reward.reward_model.engine.name", ""),
        ("reward_model.micro_batch_size_per_gpu", "reward.reward_model.engine.micro_batch_size", ""),
        ("reward_model.use_dynamic_bsz", "reward.reward_model.engine.use_dynamic_bsz", ""),
        ("reward_model.forward_max_token_len_per_gpu", "reward.reward_model.engine.max_token_len_per_micro_batch", ""),
        ("reward_model.model.trust_remote_code", "reward.reward_model.engine.trust_remote_code", ""),
        ("reward_model.model.use_remove_padding", "reward.reward_model.engine.use_remove_padding", ""),
        (None, "reward.reward_model.engine.gradient_checkpointing", "no backward pass: leave false"),
        ("reward_model.reward_manager", None, "one reward manager; reward.num_workers scores in parallel"),
        ("reward_model.launch_reward_fn_async", None, "reward.num_workers"),
        ("reward_model.max_length", None, "responses are scored whole"),
    ]),
]

# Run-level keys both entry points share (rlflow's RunConfig), with verl's names; a table of their own.
RUN_ROWS: list[Row] = [
    *((f"trainer.{key}", f"trainer.{key}", "") for key in (
        "project_name", "experiment_name", "total_epochs", "total_training_steps", "test_freq", "save_freq",
        "resume_mode", "resume_from_path", "nnodes")),
    ("trainer.logger", "trainer.logger", "console | jsonl | wandb | tensorboard"),
    ("trainer.device", "trainer.device", "auto | cpu | cuda; verl's default cuda, rlflow's auto"),
    ("trainer.default_local_dir", "trainer.default_local_dir", "rlflow's default is under outputs/"),
    ("trainer.n_gpus_per_node", "trainer.n_procs_per_node", "worker processes per node (one per GPU on GPU machines)"),
    (None, "trainer.cpus_per_proc", "CPUs Ray reserves per worker process"),
    (None, "trainer.ray_address", "null: start a local Ray"),
    (None, "trainer.ray_num_cpus", ""),
    (None, "trainer.ray_temp_dir", ""),
    (None, "trainer.ray_node_ip_address", "a local Ray listens on loopback by default"),
    ("trainer.val_before_train", "trainer.val_before_train", "SFT: the step-0 validation loss (verl's SFT has no such key)"),
    ("trainer.max_ckpt_to_keep", "trainer.max_ckpt_to_keep", "verl's SFT name; its PPO has one per role (below)"),
    (None, "trainer.max_consecutive_skipped_steps", "stop after this many non-finite-gradient steps in a row"),
    (None, "trainer.export_hf_dir", "the final model as an HF folder"),
    (None, "trainer.export_lora_adapter_dir", "LoRA: the adapters as a peft folder"),
    (None, "trainer.allow_slow_half_precision", "run bf16/fp16 on a CPU without native instructions for it"),
    (None, "trainer.plugins", "modules or .py files every process imports first"),
    ("trainer.external_lib", "trainer.external_lib", "merged into trainer.plugins"),
    *((None, f"trainer.timeouts.{key}", "seconds before a stuck phase stops the run")
      for key in ("init_s", "generate_s", "reward_s", "forward_backward_s", "sync_s", "save_s")),
    (None, "trainer.timeouts.connect_s", "seconds to join a cluster and wait for its resources"),
    ("trainer.default_hdfs_dir", None, "checkpoints stay on the local (or mounted) filesystem"),
    ("trainer.checkpoint.save_contents", None, "a checkpoint always holds model, optimizer and extra state"),
]

PPO_ENGINE_MOUNTS: list[EngineMount] = [
    ("actor.engine", f"{ACTOR}optim.", f"{ACTOR}fsdp_config."),
    ("critic.engine", "critic.optim.", "critic.model.fsdp_config."),
    ("ref.engine", None, "actor_rollout_ref.ref.fsdp_config."),
    ("reward.reward_model.engine", None, "reward_model.model.fsdp_config."),
]
SFT_ENGINE_MOUNTS: list[EngineMount] = [("engine", "optim.", None)]

PPO_SECTIONS.append(("trainer (main_ppo only)", [
    ("trainer.max_actor_ckpt_to_keep", "trainer.max_ckpt_to_keep", "one count for whole checkpoints"),
    ("trainer.max_critic_ckpt_to_keep", "trainer.max_ckpt_to_keep", "one count for whole checkpoints"),
    (None, "trainer.placement", "colocated | split"),
    (None, "trainer.seed", "the controller's seed (mini-batch shuffles)"),
    ("trainer.balance_batch", None, "batches are always balanced over the worker processes"),
    ("trainer.log_val_generations", None, "the report (python -m rlflow.observability.report) shows samples"),
    ("trainer.val_only", None, "python -m rlflow.observability.evaluate"),
    ("trainer.rollout_data_dir", None, "no rollout dumps"),
    ("trainer.validation_data_dir", None, "no validation dumps"),
    ("trainer.del_local_ckpt_after_load", None, "rlflow never deletes a checkpoint it loaded"),
]))

SFT_SECTIONS: list[tuple[str, list[Row]]] = [
    ("model", [
        ("model.partial_pretrain", "model.path", ""),
        (None, "model.preset", "an rlflow preset built on first use"),
        (None, "model.preset_seed", ""),
        (None, "model.tokenizer_path", ""),
        ("model.trust_remote_code", "model.trust_remote_code", ""),
        ("model.external_lib", "trainer.external_lib", "merged into trainer.plugins"),
        ("model.enable_gradient_checkpointing", "engine.gradient_checkpointing", ""),
        ("model.strategy", "engine.name", "fsdp | fsdp2 | a registered engine; pick it with engine=NAME"),
        ("model.fsdp_config.model_dtype", "engine.dtype", ""),
        ("model.fsdp_config.offload_params", "engine.param_offload", ""),
        ("model.fsdp_config.cpu_offload", "engine.optimizer_offload", ""),
        ("model.fsdp_config.wrap_policy.min_num_params", "engine.wrap_layer_classes", "by class, not by size"),
        ("model.lora_rank", "engine.lora.rank", ""),
        ("model.lora_alpha", "engine.lora.alpha", ""),
        ("model.target_modules", "engine.lora.target_modules", "all-linear or module names"),
        ("model.use_liger", None, "no Liger kernels"),
        ("model.use_shm", None, "loads from the filesystem"),
    ]),
    ("data", [
        *((f"data.{key}", f"data.{key}", "") for key in (
            "train_files", "val_files", "max_length", "truncation", "train_batch_size", "apply_chat_template_kwargs")),
        ("data.prompt_key", "data.prompt_key", "verl's default question, rlflow's null (chat data)"),
        ("data.response_key", "data.response_key", "verl's default answer, rlflow's null (chat data)"),
        ("data.multiturn.messages_key", "data.messages_key", ""),
        ("data.multiturn.enable", None, "chat data whenever prompt_key and response_key are null"),
        ("data.multiturn.enable_thinking_key", None, "data.apply_chat_template_kwargs applies to every row"),
        ("data.multiturn.tools_key", None, "no tool schemas"),
        ("data.micro_batch_size_per_gpu", "engine.micro_batch_size", ""),
        ("data.micro_batch_size", None, "deprecated in verl: engine.micro_batch_size is per process"),
        (None, "data.val_batch_size", "null: train_batch_size"),
        (None, "data.shuffle", ""),
        (None, "data.seed", "shuffling seed"),
        ("data.prompt_dict_keys", None, "prompt_key names a column holding a string or a message list"),
        ("data.response_dict_keys", None, "response_key names a string column"),
        ("data.chat_template", None, "set chat_template in the tokenizer folder"),
        ("data.custom_cls.path", None, "no custom dataset class"),
        ("data.balance_dp_token", None, "the loss is a token mean over the whole global batch"),
        ("data.train_max_samples", None, "cut the file instead"),
    ]),
    ("engine (verl: optim, model.fsdp_config)", [
        ("optim.lr_scheduler", "engine.lr_scheduler.name", ""),
        ("use_remove_padding", "engine.use_remove_padding", "verl's default false, rlflow's true"),
        ("ulysses_sequence_parallel_size", None, "no sequence parallelism"),
        (None, "engine.use_dynamic_bsz", ""),
        (None, "engine.max_token_len_per_micro_batch", ""),
    ]),
    ("trainer (main_sft only)", [
        ("trainer.seed", "engine.seed", "init and dropout; data.seed orders the samples"),
        (None, "trainer.launcher", "ray | torchrun"),
    ]),
]
