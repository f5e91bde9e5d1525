"""The data of the verl -> rlflow key translation (``rlflow.config.verl_keys`` reads it; docs/from_verl_keys.md shows it).

A row is ``(verl key or None, rlflow key or None, note)``: None on the verl side is an rlflow key
verl has no name for, None on the rlflow side a verl key rlflow has no equivalent for (the note
says why, or what to do instead). A verl key ending in ``.*`` covers every key below it (verl's
Megatron ``override_transformer_config.*``, the profilers). Keys were read from verl's
``ppo_trainer.yaml`` and ``ppo_megatron_trainer.yaml`` (their generated, fully expanded forms),
``sft_trainer.yaml``, and every example script of verl's ``examples/grpo_trainer``,
``examples/ppo_trainer`` and ``examples/sft`` (tests/config/verl_example_keys.txt lists those keys;
a test checks each has a row). The engine mounts share one set of rows, written once and expanded
per mount (``verl_engine_key_table``).
"""

from __future__ import annotations

from rlflow.config.verl_engine_key_table import ULYSSES, EngineMount, Row

NO_PROFILER = "no profiler integration: run under nsys or torch.profiler yourself"
REWARD_LOOP = ("rlflow scores with the reward model's own forward pass on its training engine "
               "(reward.reward_model.engine.*); there is no reward-model inference server")

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
        (f"{MODEL}lora.rank", "actor.engine.lora.rank", "verl's newer spelling of lora_rank"),
        (f"{MODEL}lora.alpha", "actor.engine.lora.alpha", "verl's newer spelling of lora_alpha"),
        (f"{MODEL}lora.lora_A_init_method", None, "A starts as peft's default, B at zero"),
        (f"{MODEL}exclude_modules", None, "name the modules to adapt in actor.engine.lora.target_modules instead"),
        (f"{MODEL}override_config.*", None, "edit the model folder's config.json"),
        (f"{MODEL}fused_kernel_options.*", None, "no fused kernels"),
        (f"{MODEL}use_liger", None, "no Liger kernels"),
        (f"{MODEL}use_fused_kernels", None, "no fused kernels"),
        (f"{MODEL}enable_activation_offload", None, "gradient_checkpointing only"),
        (f"{MODEL}use_shm", None, "loads from the filesystem"),
        ("actor_rollout_ref.hybrid_engine", "trainer.placement", "true: colocated (verl's hybrid engine); false: split, "
                                                                 "each role its own pool"),
        ("actor_rollout_ref.nccl_timeout", None, "trainer.timeouts.*_s bound each phase (docs/reliability/timeouts.md)"),
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
        ("data.custom_cls.name", None, "no custom dataset class"),
        ("data.validation_shuffle", None, "validation is never shuffled"),
        ("data.trust_remote_code", "model.trust_remote_code", "one switch for every load of the run"),
        ("data.image_key", None, "text models only"),
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
        (f"{ACTOR}ulysses_sequence_parallel_size", "actor.engine.ulysses_sequence_parallel_size", ULYSSES),
        (f"{ACTOR}checkpoint.save_contents", None, "a checkpoint always holds model, optimizer and extra state"),
        (f"{ACTOR}use_torch_compile", "actor.engine.compile", "fsdp2 and torchtitan engines: torch.compile of each "
                                                               "decoder layer; off by default (verl: on)"),
        (f"{ACTOR}entropy_from_logits_with_chunking", None, "log-probs and entropy are always computed in chunks of "
                                                            "actor.engine.logprob_chunk_size tokens"),
        (f"{ACTOR}freeze_vision_tower", None, "text models only"),
        (f"{ACTOR}profiler.*", None, NO_PROFILER),
        *_micro_batch_rows("actor", ACTOR, "ppo_micro_batch_size_per_gpu"),
        (f"{ACTOR}strategy", "actor.engine.name", "fsdp | fsdp2 | a registered engine"),
        (f"{ROLLOUT}log_prob_micro_batch_size_per_gpu", "actor.engine.forward_micro_batch_size",
         "the actor engine's forward-only passes (old log-probs); null: micro_batch_size"),
        (f"{ROLLOUT}log_prob_use_dynamic_bsz", "actor.engine.forward_use_dynamic_bsz", "null: use_dynamic_bsz, as verl inherits it"),
        (f"{ROLLOUT}log_prob_max_token_len_per_gpu", "actor.engine.forward_max_token_len_per_micro_batch",
         "null: max_token_len_per_micro_batch, as verl inherits ppo_max_token_len_per_gpu"),
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
        ("critic.forward_micro_batch_size_per_gpu", "critic.engine.forward_micro_batch_size", "the values pass; null: micro_batch_size"),
        ("critic.forward_max_token_len_per_gpu", "critic.engine.forward_max_token_len_per_micro_batch",
         "null: max_token_len_per_micro_batch"),
        ("critic.use_dynamic_bsz", "critic.engine.use_dynamic_bsz", ""),
        ("critic.ppo_max_token_len_per_gpu", "critic.engine.max_token_len_per_micro_batch", ""),
        ("critic.grad_clip", "critic.engine.optimizer.grad_clip", ""),
        ("critic.strategy", "critic.engine.name", ""),
        ("critic.model.trust_remote_code", "model.trust_remote_code", "one switch for every load of the run"),
        ("critic.ulysses_sequence_parallel_size", "critic.engine.ulysses_sequence_parallel_size", ULYSSES),
        ("critic.profiler.*", None, NO_PROFILER),
    ]),
    ("reference (verl: actor_rollout_ref.ref)", [
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "ref.engine.micro_batch_size", ""),
        ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "ref.engine.use_dynamic_bsz", ""),
        ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "ref.engine.max_token_len_per_micro_batch", ""),
        ("actor_rollout_ref.ref.strategy", "ref.engine.name", ""),
        ("actor_rollout_ref.ref.use_torch_compile", "ref.engine.compile", ""),
        ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", "ref.engine.ulysses_sequence_parallel_size", ULYSSES),
        ("actor_rollout_ref.ref.entropy_from_logits_with_chunking", None, "log-probs are always computed in chunks of "
                                                                         "ref.engine.logprob_chunk_size tokens"),
        ("actor_rollout_ref.ref.profiler.*", None, NO_PROFILER),
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
        (f"{ROLLOUT}calculate_log_probs", "rollout.calculate_log_probs", "default false as in verl; algorithm.rollout_correction needs true"),
        (f"{ROLLOUT}logprobs_mode", "rollout.logprobs_mode", ""),
        (f"{ROLLOUT}dtype", "rollout.dtype", "verl's default bfloat16, rlflow's float32"),
        (f"{ROLLOUT}max_model_len", "rollout.max_model_len", ""),
        (f"{ROLLOUT}max_num_seqs", "rollout.max_num_seqs", ""),
        (f"{ROLLOUT}enforce_eager", "rollout.enforce_eager", ""),
        (f"{ROLLOUT}enable_prefix_caching", "rollout.enable_prefix_caching", ""),
        (None, "rollout.kv_cache_space_gb", "vLLM's KV cache in GiB (CPU needs it)"),
        (f"{ROLLOUT}gpu_memory_utilization", "rollout.gpu_memory_utilization", ""),
        (f"{ROLLOUT}tensor_model_parallel_size", "rollout.tensor_parallel_size", "above 1 on a split rollout pool only "
                                                                               "(trainer.placement=split): rlflow-from-verl, "
                                                                               "whose output is colocated, drops it and "
                                                                               "says so"),
        (f"{ROLLOUT}expert_parallel_size", None, "no expert parallelism in the rollout"),
        (f"{ROLLOUT}layered_summon", None, "the weight sync streams HF-named tensors a bucket at a time "
                                           "(rollout.weight_sync_bucket_mb)"),
        (f"{ROLLOUT}checkpoint_engine.update_weights_bucket_megabytes", "rollout.weight_sync_bucket_mb", ""),
        (f"{ROLLOUT}multi_turn.enable", "rollout.multi_turn.enable", "each row runs its agent loop (docs/agents.md)"),
        *((f"{ROLLOUT}multi_turn.{key}", f"rollout.multi_turn.{key}", "") for key in (
            "max_assistant_turns", "max_user_turns", "max_parallel_calls", "max_tool_response_length",
            "tool_response_truncate_side", "format")),
        (f"{ROLLOUT}multi_turn.tool_config_path", None, "tools are registered classes: list them in "
                                                        "rollout.multi_turn.tools, options in rollout.multi_turn.tool_options"),
        (f"{ROLLOUT}multi_turn.interaction_config_path", None, "register an Env and run the env_agent loop (docs/agents.md)"),
        (f"{ROLLOUT}multi_turn.*", None, "turns are always passed as token ids, never re-tokenized"),
        (f"{ROLLOUT}agent.default_agent_loop", "rollout.multi_turn.default_agent_loop", ""),
        (f"{ROLLOUT}agent.*", None, "agent loops run inside the rollout workers (no agent worker pool); "
                                   "a plugin registers its own loop (trainer.plugins)"),
        (None, "rollout.multi_turn.tools", "registered tools the tool_agent loop offers (docs/tools.md)"),
        (None, "rollout.multi_turn.tool_options", "per-tool options"),
        (None, "rollout.multi_turn.env_class", "env_agent's environment for rows without extra_info.env_class"),
        (f"{ROLLOUT}engine_kwargs.vllm.*", "rollout.engine_kwargs.*", "vllm.LLM(...) arguments, not nested under vllm"),
        (f"{ROLLOUT}engine_kwargs.sglang.*", None, "vllm | hf rollouts only"),
        (f"{ROLLOUT}engine_kwargs.trtllm.*", None, "vllm | hf rollouts only"),
        (f"{ROLLOUT}free_cache_engine", "rollout.free_cache_engine", ""),
        (None, "rollout.weight_sync_bucket_mb", ""),
        (None, "rollout.lora_sync", "a LoRA actor's sync: merged | adapter"),
        (None, "rollout.lora_rank", "the actor's lora.rank (interpolated)"),
        (None, "rollout.prompt_overflow", ""),
        (None, "rollout.num_replicas", "a split rollout pool of this many processes"),
        (f"{ROLLOUT}engine_kwargs.vllm", "rollout.engine_kwargs", "vllm.LLM(...) arguments, not nested under vllm"),
        (None, "rollout.trust_remote_code", "defaults to model.trust_remote_code"),
        (None, "rollout.debug_skip_weight_sync_steps", "test only: skip the first N weight syncs (a stale rollout)"),
        *((f"{ROLLOUT}val_kwargs.{key}", f"rollout.val_kwargs.{key}", "")
          for key in ("n", "temperature", "top_p", "top_k", "do_sample")),
        *((None, f"rollout.val_kwargs.{key}", "") for key in ("seed", "stop", "max_new_tokens")),
        (f"{ROLLOUT}mode", None, "one in-process engine per rollout worker (no async server)"),
        (f"{ROLLOUT}max_num_batched_tokens", None, "pass it in rollout.engine_kwargs"),
        (f"{ROLLOUT}enable_chunked_prefill", None, "pass it in rollout.engine_kwargs"),
        (f"{ROLLOUT}load_format", None, "weights always come from the actor at the first sync"),
        (f"{ROLLOUT}ignore_eos", None, "generation stops at EOS"),
        (f"{ROLLOUT}data_parallel_size", None, "rollout.num_replicas"),
        (f"{ROLLOUT}over_sample_rate", None, "no over-sampling"),
        (f"{ROLLOUT}multi_stage_wake_up", None, "free_cache_engine sleeps and wakes the whole engine"),
    ]),
    ("algorithm", [
        *((f"algorithm.{key}", f"algorithm.{key}", "") for key in (
            "adv_estimator", "gamma", "lam", "norm_adv_by_std_in_grpo", "use_kl_in_reward", "kl_penalty",
            "kl_ctrl.type", "kl_ctrl.kl_coef", "kl_ctrl.target_kl", "kl_ctrl.horizon")),
        *((f"algorithm.rollout_correction.{key}", f"algorithm.rollout_correction.{key}", "") for key in (
            "rollout_is", "rollout_is_batch_normalize", "loss_type")),
        ("algorithm.rollout_correction.rollout_rs", "algorithm.rollout_correction.rollout_rs",
         "verl's eleven options (token_k1 .. seq_max_k3), comma-joined"),
        ("algorithm.rollout_correction.rollout_rs_threshold", "algorithm.rollout_correction.rollout_rs_threshold", ""),
        ("algorithm.rollout_correction.bypass_mode", "algorithm.rollout_correction.bypass_mode",
         "the step runs no old-log-prob pass; its loss corrects per micro-batch"),
        ("algorithm.rollout_correction.rollout_is_threshold", "algorithm.rollout_correction.rollout_is_threshold",
         "also \"lower_upper\": masked IS (IcePop)"),
        ("algorithm.use_pf_ppo", None, "no PF-PPO reweighting"),
        ("algorithm.pf_ppo.*", None, "no PF-PPO reweighting"),
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
        ("reward_model.use_reward_loop", None, REWARD_LOOP),
        ("reward_model.rollout.*", None, REWARD_LOOP),
        ("reward_model.num_workers", None, "the reward model runs in the trainer's worker processes; reward.num_workers "
                                           "is for rule rewards"),
        ("reward_model.reward_kwargs.*", None, "a custom reward function (reward.custom_function) takes its own arguments"),
        ("reward_model.sandbox_fusion.*", None, "no code sandbox; score code with reward.custom_function"),
    ]),
]

# Run-level keys both entry points share (rlflow's RunConfig), with verl's names; a table of their own.
RUN_ROWS: list[Row] = [
    *((f"trainer.{key}", f"trainer.{key}", "") for key in (
        "project_name", "experiment_name", "total_epochs", "total_training_steps", "test_freq", "save_freq",
        "resume_from_path", "nnodes")),
    ("trainer.resume_mode", "trainer.resume_mode", "verl's resume_path is rlflow's path; auto and disable are the same"),
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
    EngineMount("actor.engine", f"{ACTOR}optim.", f"{ACTOR}fsdp_config.", f"{ACTOR}megatron."),
    EngineMount("critic.engine", "critic.optim.", "critic.model.fsdp_config.", "critic.megatron."),
    EngineMount("ref.engine", None, "actor_rollout_ref.ref.fsdp_config.", "actor_rollout_ref.ref.megatron."),
    EngineMount("reward.reward_model.engine", None, "reward_model.model.fsdp_config.", "reward_model.megatron."),
]
SFT_ENGINE_MOUNTS: list[EngineMount] = [EngineMount("engine", "optim.", None)]

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
    ("trainer.use_legacy_worker_impl", None, "one worker implementation"),
    ("global_profiler.*", None, NO_PROFILER),
]))
PPO_SECTIONS.append(("async_training (verl: the one-step-off and fully-async recipes)", [
    (None, "async_training.mode", "sync | one_step_off | fully_async; verl picks a recipe's entry point instead"),
    (None, "async_training.rollout_correction", "asynchronous modes: token TIS unless algorithm.rollout_correction is set"),
    ("async_training.staleness_threshold", "async_training.staleness_threshold", "counts actor updates (verl: extra samples)"),
    ("async_training.trigger_parameter_sync_step", "async_training.trigger_parameter_sync_step", ""),
    ("async_training.require_batches", "async_training.require_batches", "generation calls a step's batch is split "
                                                                         "into (verl: mini-batches a step waits for)"),
    ("async_training.partial_rollout", "async_training.partial_rollout", ""),
    (None, "async_training.restart_rollout", "a rollout pool that dies is started again (at most 3 times)"),
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
        ("model.fsdp_config.wrap_policy.min_num_params", None, "rlflow wraps by class (engine.wrap_layer_classes), not by size"),
        ("model.lora_rank", "engine.lora.rank", ""),
        ("model.lora_alpha", "engine.lora.alpha", ""),
        ("model.target_modules", "engine.lora.target_modules", "all-linear or module names"),
        ("model.use_liger", None, "no Liger kernels"),
        ("model.use_shm", None, "loads from the filesystem"),
        ("model.path", "model.path", "verl's engine-based SFT trainer's name"),
        ("model.use_remove_padding", "engine.use_remove_padding", "verl's engine-based SFT trainer's name"),
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
        ("data.prompt_dict_keys", "data.prompt_key", "a dotted path: prompt_key=extra_info with prompt_dict_keys=[question] "
                                                     "is data.prompt_key=extra_info.question"),
        ("data.response_dict_keys", "data.response_key", "a dotted path: data.response_key=extra_info.answer"),
        ("data.chat_template", None, "set chat_template in the tokenizer folder"),
        ("data.custom_cls.path", None, "no custom dataset class"),
        ("data.balance_dp_token", None, "the loss is a token mean over the whole global batch"),
        ("data.train_max_samples", None, "cut the file instead"),
        ("data.use_dynamic_bsz", "engine.use_dynamic_bsz", "verl's engine-based SFT trainer's name"),
        ("data.max_token_len_per_gpu", "engine.max_token_len_per_micro_batch", "verl's engine-based SFT trainer's name"),
        ("data.pad_mode", None, "sequences are always packed without padding (engine.use_remove_padding)"),
    ]),
    ("engine (verl: optim, model.fsdp_config)", [
        ("optim.lr_scheduler", "engine.lr_scheduler.name", ""),
        ("use_remove_padding", "engine.use_remove_padding", "verl's default false, rlflow's true"),
        ("ulysses_sequence_parallel_size", "engine.ulysses_sequence_parallel_size", ULYSSES),
        ("engine.strategy", "engine.name", "verl's engine-based SFT trainer: fsdp | fsdp2 | megatron"),
        ("engine.fsdp_size", "engine.hybrid_replicate_size", "inverse view: verl names the shard group size, rlflow "
                                                             "the number of replicas (fsdp2 engine)"),
        ("engine.ulysses_sequence_parallel_size", "engine.ulysses_sequence_parallel_size", ULYSSES),
        ("engine.context_parallel_size", None, "no context parallelism"),
        ("engine.virtual_pipeline_model_parallel_size", None, "no interleaved schedule: one model chunk per pipeline stage"),
        ("engine.use_mbridge", None, "rlflow's megatron engine converts the HF folder itself"),
        ("engine.vanilla_mbridge", None, "rlflow's megatron engine converts the HF folder itself"),
    ]),
    ("trainer (main_sft only)", [
        ("checkpoint.save_contents", None, "a checkpoint always holds model, optimizer and extra state"),
        ("trainer.seed", "engine.seed", "init and dropout; data.seed orders the samples"),
        (None, "trainer.launcher", "ray | torchrun"),
    ]),
]
