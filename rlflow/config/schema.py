"""Dataclass schemas for the PPO/GRPO and SFT entry points.

Every YAML under ``rlflow/configs/`` is merged into these at start-up (see
``validation.py``), so the field list here is the full set of legal keys.
Each key is documented in the YAML that sets it; names follow verl's where
verl has one, so configs carry over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from rlflow.config.async_schema import AsyncTrainingConfig
from rlflow.config.multi_turn_schema import MultiTurnConfig
from rlflow.config.ranges import (AT_LEAST_1, FINITE, FRACTION, NON_NEGATIVE, OFF_OR_AT_LEAST_1, POSITIVE, SEED, Range,
                                  Ranges)

EVERY_N_STEPS = Range(-1, note="-1 or 0: never")  # trainer.test_freq, trainer.save_freq

# Value tables of choice keys (checked at config loading, rlflow/config/loading/choices.py).
RESUME_MODES = ("auto", "force", "disable", "path")  # trainer.resume_mode
RECOMPUTE_MODES = ("auto", "always")  # actor.recompute_old_log_probs


@dataclass
class ModelConfig:
    """Which HF checkpoint folder every role loads (the tiny preset by default)."""

    path: Optional[str] = None  # an existing HF folder (never created); null: the preset's own folder
    preset: Optional[str] = "tiny"  # with path null: build this preset into outputs/models/<preset> on first use
    preset_seed: int = 0
    tokenizer_path: Optional[str] = None  # defaults to `path`
    trust_remote_code: bool = False  # every HF load (engines, rollout, tokenizers) may run code shipped in the folder

    RANGES: ClassVar[Ranges] = {"preset_seed": SEED}


@dataclass
class DataConfig:
    """Where RL prompts come from and how they are tokenized and batched."""

    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    prompt_key: str = "prompt"
    max_prompt_length: int = 64
    max_response_length: int = 32
    train_batch_size: int = 16
    val_batch_size: Optional[int] = None  # null: the whole val set in one batch
    truncation: str = "error"  # error | left | right | filter
    filter_overlong_prompts: bool = False
    shuffle: bool = True
    seed: int = 0
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # extra chat template variables

    RANGES: ClassVar[Ranges] = {"max_prompt_length": AT_LEAST_1, "max_response_length": AT_LEAST_1,
                                "train_batch_size": AT_LEAST_1, "val_batch_size": AT_LEAST_1, "seed": SEED}


@dataclass
class PolicyLossConfig:
    """Options of the registered policy losses (verl's actor.policy_loss)."""

    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1

    RANGES: ClassVar[Ranges] = {"clip_cov_ratio": FRACTION, "clip_cov_lb": FINITE, "clip_cov_ub": FINITE,
                                "kl_cov_ratio": FRACTION, "ppo_kl_coef": NON_NEGATIVE}


@dataclass
class ActorConfig:
    """The policy being trained: its engine and its PPO update settings."""

    engine: Any = None  # validated against the engine's own dataclass (rlflow/configs/engine/*.yaml)
    ppo_mini_batch_size: int = 16  # in prompts; x rollout.n sequences per optimizer step
    ppo_epochs: int = 1
    shuffle: bool = True
    recompute_old_log_probs: str = "auto"  # auto: reuse the update's forward when exactly on-policy | always
    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = None
    clip_ratio_high: Optional[float] = None
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)

    RANGES: ClassVar[Ranges] = {
        "ppo_mini_batch_size": AT_LEAST_1, "ppo_epochs": AT_LEAST_1, "clip_ratio": POSITIVE, "clip_ratio_low": POSITIVE,
        "clip_ratio_high": POSITIVE, "clip_ratio_c": Range(1, low_open=True, note="the dual-clip bound"),
        "tau_pos": POSITIVE, "tau_neg": POSITIVE, "entropy_coeff": FINITE, "kl_loss_coef": NON_NEGATIVE,
    }


@dataclass
class CriticModelConfig:
    """Where the critic's weights come from."""

    path: Optional[str] = None  # HF folder (causal LM, sequence/token classification); null: the actor's model


@dataclass
class CriticConfig:
    """The value model used by GAE; ignored by critic-free estimators."""

    engine: Any = None
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    ppo_mini_batch_size: int = 16
    ppo_epochs: int = 1
    shuffle: bool = True
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    warmup_steps: int = 0  # verl's trainer.critic_warmup: steps that update only the critic

    RANGES: ClassVar[Ranges] = {"ppo_mini_batch_size": AT_LEAST_1, "ppo_epochs": AT_LEAST_1, "cliprange_value": POSITIVE,
                                "warmup_steps": NON_NEGATIVE}


@dataclass
class RefConfig:
    """The frozen reference policy used for KL terms."""

    engine: Any = None


@dataclass
class SamplingConfig:
    """Sampling parameters for one use of the rollout (training or validation).

    ``rlflow.rollout.sampling`` turns this (or the flat training keys of ``RolloutConfig``) into
    the concrete parameters both rollout backends read; see rlflow/configs/rollout/vllm.yaml.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True  # false: greedy
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    max_new_tokens: Optional[int] = None  # null: rollout.response_length

    RANGES: ClassVar[Ranges] = {"n": AT_LEAST_1, "temperature": Range(0, note="0: greedy"), "top_p": Range(0, 1, low_open=True),
                                "top_k": OFF_OR_AT_LEAST_1, "seed": SEED, "max_new_tokens": AT_LEAST_1}


@dataclass
class RolloutConfig:
    """The inference engine that generates responses (backend, engine sizing, sampling, weight sync)."""

    name: str = "vllm"  # vllm | hf
    prompt_length: int = 64  # longest prompt in tokens (the data's max_prompt_length)
    response_length: int = 32  # max new tokens per response in training (the data's max_response_length)
    n: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    seed: Optional[int] = 0
    stop: list[str] = field(default_factory=list)
    calculate_log_probs: bool = False  # return rollout_log_probs (verl's key and default); rollout correction needs it
    logprobs_mode: str = "processed_logprobs"  # processed_logprobs | raw_logprobs
    dtype: str = "float32"
    max_model_len: Optional[int] = None  # null: prompt_length + response_length
    max_num_seqs: int = 256
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    kv_cache_space_gb: Optional[float] = 1.0  # vLLM KV cache in GiB (unused when gpu_memory_utilization is set)
    gpu_memory_utilization: Optional[float] = None  # GPU only: KV cache = this fraction of free device memory
    tensor_parallel_size: int = 1
    free_cache_engine: bool = True  # sleep/wake between phases when colocated on GPU
    weight_sync_bucket_mb: int = 64
    lora_sync: str = "merged"  # a LoRA actor's sync: merged (base + adapters) | adapter (adapters only; docs/lora.md)
    lora_rank: int = 0  # the actor's adapter rank (actor.engine.lora.rank); sizes the engine's adapter slots
    prompt_overflow: str = "error"  # error | truncate_left
    num_replicas: int = 0  # 0: one per actor DP rank (colocated); >0: a split rollout pool
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # extra vllm.LLM(...) arguments
    trust_remote_code: bool = False  # loads may run code shipped in the folder (YAML: model's)
    debug_skip_weight_sync_steps: int = 0  # TEST ONLY: skip the first N weight syncs (a deliberately stale rollout)
    val_kwargs: SamplingConfig = field(default_factory=lambda: SamplingConfig(n=1, temperature=0.0, do_sample=False))
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)  # agent loops and tools (docs/agents.md)

    RANGES: ClassVar[Ranges] = {
        **SamplingConfig.RANGES, "prompt_length": AT_LEAST_1, "response_length": AT_LEAST_1, "max_model_len": AT_LEAST_1,
        "max_num_seqs": AT_LEAST_1, "kv_cache_space_gb": POSITIVE, "gpu_memory_utilization": Range(0, 1, low_open=True),
        "tensor_parallel_size": AT_LEAST_1, "weight_sync_bucket_mb": AT_LEAST_1, "lora_rank": NON_NEGATIVE,
        "num_replicas": Range(0, note="0: one per actor DP rank"), "debug_skip_weight_sync_steps": NON_NEGATIVE,
    }


@dataclass
class KLControlConfig:
    """KL-in-reward coefficient controller."""

    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000

    RANGES: ClassVar[Ranges] = {"kl_coef": NON_NEGATIVE, "target_kl": POSITIVE, "horizon": AT_LEAST_1}


@dataclass
class RolloutCorrectionConfig:
    """Importance weights and rejection from the rollout's own log-probs (verl's ``algorithm.rollout_correction``;
    defaults are verl's YAML's: metrics only). rlflow/configs/rollout_correction/*.yaml holds presets."""

    rollout_is: Optional[str] = None  # IS level: token | sequence; null: no weights
    rollout_is_threshold: Any = 2.0  # a number: truncate (TIS); "lower_upper": zero the weights outside (IcePop)
    rollout_is_batch_normalize: bool = False  # divide the weights by their batch mean
    rollout_rs: Optional[str] = None  # rejection options, comma-joined: token_k1..k3, seq_sum_k*, seq_mean_k*, seq_max_k2/k3
    rollout_rs_threshold: Any = None  # one spec per option (or one shared): a number, or "lower_upper" for *_k1
    bypass_mode: bool = False  # true: the rollout's log-probs are the old ones (no old-log-prob pass)
    loss_type: str = "ppo_clip"  # bypass mode's loss: ppo_clip | reinforce


@dataclass
class AlgorithmConfig:
    """Advantage estimation and KL-in-reward (verl's `algorithm` group)."""

    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)

    RANGES: ClassVar[Ranges] = {"gamma": FRACTION, "lam": FRACTION}


@dataclass
class RewardModelConfig:
    """A reward model (an HF *ForSequenceClassification folder) whose score at each response's last token scores it."""

    enable: bool = False
    path: Optional[str] = None  # HF folder (sequence/token classification, num_labels=1); null: model.path
    engine: Any = None  # validated against the engine's own dataclass (rlflow/configs/engine/*.yaml)


@dataclass
class RewardConfig:
    """How responses are scored."""

    custom_function: Optional[str] = None  # path/to/file.py:fn or module.path:fn
    num_workers: int = 0  # >0: score in a pool of worker processes
    error_score: float = 0.0  # score given when a reward function raises or returns non-finite
    max_error_fraction: float = 0.5  # abort when more of a training batch got error_score (rlflow/trainer/divergence.py)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    combine: str = "replace"  # with a reward model: replace (rm_weight*rm) | add (rule + rm_weight*rm); rlflow/rewards/combine.py
    rm_weight: float = 1.0  # weight of the reward model's score in `combine`

    RANGES: ClassVar[Ranges] = {"num_workers": Range(0, note="0: score in the driver"), "error_score": FINITE,
                                "max_error_fraction": Range(0, 1, note="1: never abort"), "rm_weight": FINITE}


@dataclass
class TimeoutsConfig:
    """Seconds the driver waits on each phase before it stops the run (trainer.timeouts; docs/reliability/timeouts.md).

    Generous for real GPU runs, but finite: a hung engine, reward function or rank ends the run
    with one line naming the phase, the role and the ranks, instead of waiting forever.
    """

    init_s: float = 3600.0  # worker start-up: model load, process groups, vLLM engine build
    generate_s: float = 7200.0  # one generate call (long-CoT rollouts of a 7B model take many minutes)
    reward_s: float = 3600.0  # scoring one batch (rule/custom functions, reward model)
    forward_backward_s: float = 7200.0  # one log-prob/value pass, one actor mini-batch update, one critic update
    sync_s: float = 1800.0  # actor -> rollout weight sync
    save_s: float = 3600.0  # checkpoint save/load and the HF export
    connect_s: float = 120.0  # joining a cluster (trainer.ray_address, RAY_ADDRESS), and waiting for it to offer the workers' resources

    RANGES: ClassVar[Ranges] = {f"{phase}_s": Range(0, low_open=True, note="seconds")
                                for phase in ("init", "generate", "reward", "forward_backward", "sync", "save", "connect")}


@dataclass
class ClusterConfig:
    """Where an entry point's worker groups run, what every process imports, and how long a worker call may take."""

    device: str = "auto"  # auto | cpu | cuda
    nnodes: int = 1
    n_procs_per_node: int = 1
    cpus_per_proc: float = 1.0
    ray_address: Optional[str] = None  # null: start a local Ray; "auto": join a running cluster
    ray_num_cpus: Optional[float] = None
    ray_temp_dir: Optional[str] = None  # local Ray's session folder (short path); null: Ray's default
    ray_node_ip_address: Optional[str] = "127.0.0.1"  # local Ray listens here only; a real IP/null: other machines may join
    allow_slow_half_precision: bool = False  # run bf16/fp16 compute on a CPU without native instructions for it (docs/platform.md)
    plugins: list[str] = field(default_factory=list)  # modules / .py files every process imports first (docs/config.md)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    external_lib: Any = None  # verl's spelling: a module or file, or a list; merged into `plugins` at start-up

    RANGES: ClassVar[Ranges] = {"nnodes": AT_LEAST_1, "n_procs_per_node": AT_LEAST_1, "cpus_per_proc": POSITIVE,
                                "ray_num_cpus": POSITIVE}


@dataclass
class RunConfig(ClusterConfig):
    """Run-level settings every trainer shares: the cluster's, plus names, trackers, loop length, checkpoints."""

    project_name: str = "rlflow"
    experiment_name: str = "run"
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    total_epochs: int = 1
    total_training_steps: Optional[int] = None  # overrides total_epochs
    test_freq: int = -1
    val_before_train: bool = True
    save_freq: int = -1
    default_local_dir: str = "outputs/checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    resume_mode: str = "auto"  # auto | force | disable | path (RESUME_MODES)
    resume_from_path: Optional[str] = None
    max_ckpt_to_keep: Optional[int] = None
    max_consecutive_skipped_steps: int = 5  # abort after this many non-finite-gradient steps in a row; 0: never
    export_hf_dir: Optional[str] = None  # null: <default_local_dir>/hf
    export_lora_adapter_dir: Optional[str] = None  # with LoRA: also write the adapters as a peft folder here; null: don't

    RANGES: ClassVar[Ranges] = {"total_epochs": AT_LEAST_1, "total_training_steps": AT_LEAST_1,
                                "test_freq": EVERY_N_STEPS, "save_freq": EVERY_N_STEPS,
                                "max_ckpt_to_keep": AT_LEAST_1, "max_consecutive_skipped_steps": Range(0, note="0: never abort")}


@dataclass
class TrainerConfig(RunConfig):
    """Run-level settings of `main_ppo`: the shared ones plus role placement and the controller seed."""

    placement: str = "colocated"  # colocated | split
    seed: int = 0

    RANGES: ClassVar[Ranges] = {"seed": SEED}


@dataclass
class PPOConfig:
    """The whole `main_ppo` config (rlflow/configs/ppo_trainer.yaml)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)  # docs/async.md


@dataclass
class SFTDataConfig:
    """SFT chat data: multi-turn `messages`, or prompt/response pairs (rlflow/configs/sft_trainer.yaml `data:`)."""

    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)  # empty: no validation loss
    messages_key: str = "messages"
    prompt_key: Optional[str] = None  # set both prompt_key and response_key for pair data
    response_key: Optional[str] = None
    max_length: int = 128
    truncation: str = "error"  # error | left | right
    train_batch_size: int = 32  # samples per optimizer step, over all data-parallel ranks
    val_batch_size: Optional[int] = None  # null: train_batch_size
    shuffle: bool = True
    seed: int = 0
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # extra chat template variables

    RANGES: ClassVar[Ranges] = {"max_length": Range(2, note="a prompt token and a response token"),
                                "train_batch_size": AT_LEAST_1, "val_batch_size": AT_LEAST_1, "seed": SEED}


@dataclass
class SFTTrainerConfig(RunConfig):
    """Run-level settings of `main_sft`: the shared ones plus the launcher."""

    experiment_name: str = "sft"
    launcher: str = "ray"  # ray | torchrun


@dataclass
class SFTConfig:
    """The whole `main_sft` config (rlflow/configs/sft_trainer.yaml)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    engine: Any = None
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
