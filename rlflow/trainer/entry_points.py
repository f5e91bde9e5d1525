"""The drivers' two entry points, ``main_ppo`` and ``main_sft``, as config loading sees them.

Each ``EntryPoint`` (``rlflow.config.loading``) names its YAML, schema, engine mounts and the
choice keys it checks before Ray starts, the machine checks ``run`` adds (the cluster answers and has room),
and its ``preflight`` (what ``--validate`` runs after them, ``preflight.py``); the driver-level tables (``trainer.placement``,
``trainer.launcher``) are this package's registries, handed down here so that config loading
imports no driver.
"""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig

from rlflow.algos import check_rollout_correction
from rlflow.config import ConfigError
from rlflow.config.loading.choices import (
    Choice,
    mounted_engine_choices,
    ppo_algorithm_choices,
    rollout_choices,
    run_choices,
    sft_data_choices,
)
from rlflow.config.loading.dtype_guard import ppo_dtype_keys, sft_dtype_keys
from rlflow.config.loading.entry_point import EntryPoint
from rlflow.config.loading.rollout_memory import check_rollout_memory
from rlflow.config.schema import PPOConfig, SFTConfig
from rlflow.rewards.custom import check_custom_function
from rlflow.rollout import ROLLOUT_REGISTRY, check_tensor_parallel_size
from rlflow.rollout.sampling import check_rollout_sampling
from rlflow.trainer.async_checks import settle_async_training
from rlflow.trainer.cluster_checks import check_local_cluster_fits
from rlflow.trainer.placement import PLACEMENT_REGISTRY, processes_per_node
from rlflow.trainer.ppo_setup import PPO_RUN_KEYS
from rlflow.trainer.preflight import preflight_ppo, preflight_sft
from rlflow.trainer.run_intent import check_run_intent
from rlflow.trainer.sft_launchers import LAUNCHER_REGISTRY
from rlflow.trainer.training_modes import TRAINING_MODE_REGISTRY
from rlflow.workers.ray_connect import check_cluster_reachable

# Where the `engine` group is mounted in each entry point's config.
PPO_ENGINE_MOUNTS = ("actor.engine", "critic.engine", "ref.engine", "reward.reward_model.engine")
SFT_ENGINE_MOUNTS = ("engine",)


def _check_lora_sync(config: DictConfig) -> None:
    """``rollout.lora_sync=adapter`` needs a LoRA actor and a rollout backend that applies adapters."""
    if config.rollout.lora_sync != "adapter":
        return
    if int(config.actor.engine.lora.rank) <= 0:
        raise ConfigError("config key 'rollout.lora_sync': adapter sync needs a LoRA actor (actor.engine.lora.rank > 0); "
                          "set rollout.lora_sync=merged")
    if not ROLLOUT_REGISTRY.get(config.rollout.name).takes_lora_adapters:
        raise ConfigError(f"config key 'rollout.lora_sync': the {config.rollout.name} rollout takes merged weights only; "
                          "set rollout.lora_sync=merged or rollout=vllm")


def _check_rollout_tensor_parallel(config: DictConfig) -> None:
    """A rollout split over tensor-parallel shards needs a backend that runs them and a split rollout pool, whose
    workers reserve a device (a CPU on CPU) per shard."""
    check_tensor_parallel_size(config.rollout)
    size = int(config.rollout.tensor_parallel_size)
    if size > 1 and config.trainer.placement != "split":
        raise ConfigError(f"config key 'rollout.tensor_parallel_size': {size} shards need trainer.placement=split, whose "
                          f"rollout workers reserve {size} devices each; a colocated worker holds one device")


def _check_ppo_cluster(config: DictConfig) -> None:
    check_cluster_reachable(config.trainer)
    check_local_cluster_fits(config, processes_per_node)


def _check_sft_cluster(config: DictConfig) -> None:
    """Only ``trainer.launcher=ray`` runs a Ray cluster (torchrun's ranks are the processes)."""
    if config.trainer.launcher == "ray":
        check_cluster_reachable(config.trainer)
        check_local_cluster_fits(config, lambda sft_config: sft_config.trainer.n_procs_per_node)


def _ppo_choices() -> list[Choice]:
    return [*run_choices(), Choice("trainer.placement", PLACEMENT_REGISTRY),
            Choice("async_training.mode", TRAINING_MODE_REGISTRY), *ppo_algorithm_choices(),
            *rollout_choices(), *mounted_engine_choices(PPO_ENGINE_MOUNTS)]


def _sft_choices() -> list[Choice]:
    return [*run_choices(), Choice("trainer.launcher", LAUNCHER_REGISTRY), *sft_data_choices(),
            *mounted_engine_choices(SFT_ENGINE_MOUNTS)]


PPO_ENTRY = EntryPoint(
    config_name="ppo_trainer",
    schema=PPOConfig,
    choices=_ppo_choices,
    dtype_keys=lambda: ppo_dtype_keys(PPO_ENGINE_MOUNTS),
    engine_mounts=PPO_ENGINE_MOUNTS,
    policy_mounts=("actor.engine",),
    group_shorthands={mount: "engine" for mount in PPO_ENGINE_MOUNTS},  # actor.engine=fsdp
    checks=(_check_lora_sync, _check_rollout_tensor_parallel, check_rollout_memory, check_rollout_sampling, settle_async_training, check_rollout_correction,
            check_custom_function, check_run_intent),
    machine_checks=(_check_ppo_cluster,),
    preflight=preflight_ppo,
    run_keys=PPO_RUN_KEYS,
)

SFT_ENTRY = EntryPoint(
    config_name="sft_trainer",
    schema=SFTConfig,
    choices=_sft_choices,
    dtype_keys=lambda: sft_dtype_keys(SFT_ENGINE_MOUNTS),
    engine_mounts=SFT_ENGINE_MOUNTS,
    policy_mounts=("engine",),
    group_shorthands={"engine": "engine", "data": "sft_data"},  # data=synthetic: rlflow/configs/sft_data/synthetic.yaml
    checks=(check_run_intent,),
    machine_checks=(_check_sft_cluster,),
    preflight=preflight_sft,
)


def compose_ppo_config(overrides: Sequence[str]) -> DictConfig:
    """The validated config ``main_ppo`` builds from these command-line overrides, composed in-process."""
    return PPO_ENTRY.compose(overrides)


def compose_sft_config(overrides: Sequence[str]) -> DictConfig:
    """The validated config ``main_sft`` builds from these command-line overrides, composed in-process."""
    return SFT_ENTRY.compose(overrides)
