"""Turn a composed Hydra config into a validated, typed one for each entry point."""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from rlflow.config import ConfigError, validate_config
from rlflow.config.schema import PPOConfig, SFTConfig
from rlflow.engines.common.forward.lora import check_adapter_folder
from rlflow.engines.config import EngineConfigError, config_from_mapping
from rlflow.engines.registry import EngineRegistry
from rlflow.rollout import ROLLOUT_REGISTRY
from rlflow.trainer.config_choices import Choice, check_choices, ppo_choices, sft_choices
from rlflow.trainer.dtype_guard import ComputeDtypeKey, check_half_precision, ppo_dtype_keys, sft_dtype_keys
from rlflow.trainer.timeouts import check_timeouts
from rlflow.utils.plugins import import_plugins

# Where the `engine` group is mounted in each entry point's config.
PPO_ENGINE_MOUNTS = ("actor.engine", "critic.engine", "ref.engine", "reward.reward_model.engine")
SFT_ENGINE_MOUNTS = ("engine",)
# The engines that train the policy (a causal LM) in every run of the entry point: what their options need
# (LoRA, mixed precision) is checked against the engine's capabilities before any worker starts.
PPO_POLICY_MOUNTS = ("actor.engine",)
SFT_POLICY_MOUNTS = ("engine",)
# Command-line shorthands each entry point expands (``entry.expand_group_shorthands``): mount key -> group.
PPO_GROUP_SHORTHANDS = {mount: "engine" for mount in PPO_ENGINE_MOUNTS}  # actor.engine=fsdp
SFT_GROUP_SHORTHANDS = {"engine": "engine", "data": "sft_data"}  # data=synthetic picks rlflow/configs/sft_data/synthetic.yaml
# Keys naming plugins, in import order: rlflow's, then verl's spelling (merged into the first).
PLUGIN_KEYS = ("trainer.plugins", "trainer.external_lib")


def _engine_schema_resolver(path: str):
    def resolve(node: DictConfig) -> type:
        try:
            return EngineRegistry.get(str(node.get("name")), config_key=f"{path}.name").config_class
        except EngineConfigError as error:
            raise ConfigError(str(error)) from None

    return resolve


def _check_engine_supports(config: DictConfig, mount: str) -> None:
    """The engine at ``mount`` supports what its options ask for (``BaseEngine.check_supported``), else one line."""
    node = OmegaConf.select(config, mount)
    engine_class = EngineRegistry.get(str(node.name), config_key=f"{mount}.name")
    try:
        engine_config = config_from_mapping(engine_class.config_class, node)
        engine_class.check_supported(engine_config)
        if engine_config.lora.enabled and engine_config.lora.adapter_path:
            check_adapter_folder(engine_config.lora)
    except EngineConfigError as error:
        raise ConfigError(f"config key '{mount}': {error}") from None


def _plugin_specs(cfg: DictConfig, key: str) -> list[str]:
    value: Any = OmegaConf.select(cfg, key)
    values = list(value) if isinstance(value, (ListConfig, list, tuple)) else [] if value is None else [value]
    if not all(isinstance(spec, str) for spec in values):
        raise ConfigError(f"config key '{key}': expected a module name or a path to a .py file (or a list of them), got {value!r}")
    return values


def import_configured_plugins(cfg: DictConfig) -> DictConfig:
    """Import the plugins a raw (not yet validated) config names; validation may need what they register.

    Returns a copy whose ``trainer.plugins`` lists every plugin imported (``.py`` paths made
    absolute, ``trainer.external_lib`` merged in and set to null), which is what the worker
    processes and ``torchrun`` ranks import in turn.
    """
    plugins = import_plugins([spec for key in PLUGIN_KEYS for spec in _plugin_specs(cfg, key)])
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.trainer.plugins = plugins
        cfg.trainer.external_lib = None
    return cfg


def load_entry_config(cfg: DictConfig, schema: type, engine_mounts: tuple[str, ...],
                      choices: Callable[[tuple[str, ...]], list[Choice]],
                      dtype_keys: Callable[[tuple[str, ...]], list[ComputeDtypeKey]], policy_mounts: tuple[str, ...]) -> DictConfig:
    """Validate an entry point's composed config against ``schema``: plugins first (they may register names), then keys and types, every choice value, what the policy engine
    supports, the timeouts, bf16/fp16 on CPU."""
    cfg = import_configured_plugins(cfg)
    config = validate_config(cfg, schema, {path: _engine_schema_resolver(path) for path in engine_mounts})
    check_choices(config, choices(engine_mounts))
    for mount in policy_mounts:
        _check_engine_supports(config, mount)
    check_timeouts(config.trainer.timeouts)
    check_half_precision(config, dtype_keys(engine_mounts))
    return config


def load_ppo_config(cfg: DictConfig) -> DictConfig:
    """Validate a composed ``ppo_trainer`` config; raises a ``UserError`` naming the bad key."""
    config = load_entry_config(cfg, PPOConfig, PPO_ENGINE_MOUNTS, ppo_choices, ppo_dtype_keys, PPO_POLICY_MOUNTS)
    _check_lora_sync(config)
    return config


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


def load_sft_config(cfg: DictConfig) -> DictConfig:
    """Validate a composed ``sft_trainer`` config; raises a ``UserError`` naming the bad key."""
    return load_entry_config(cfg, SFTConfig, SFT_ENGINE_MOUNTS, sft_choices, sft_dtype_keys, SFT_POLICY_MOUNTS)


def compose_ppo_config(overrides: Sequence[str]) -> DictConfig:
    """The validated config ``main_ppo`` builds from these command-line overrides, composed in-process."""
    return load_ppo_config(compose_entry_config("ppo_trainer", overrides, PPO_GROUP_SHORTHANDS))


def compose_sft_config(overrides: Sequence[str]) -> DictConfig:
    """The validated config ``main_sft`` builds from these command-line overrides, composed in-process."""
    return load_sft_config(compose_entry_config("sft_trainer", overrides, SFT_GROUP_SHORTHANDS))


def compose_entry_config(config_name: str, overrides: Sequence[str], shorthands: dict[str, str],
                         free_form_mappings: tuple[str, ...] = ()) -> DictConfig:
    """The raw config an entry point's Hydra parse gives for these command-line overrides, composed in-process."""
    from hydra import compose, initialize_config_dir

    from rlflow.trainer.entry import CONFIG_DIR, add_free_form_keys, expand_group_shorthands
    from rlflow.trainer.verl_overrides import check_verl_overrides

    check_verl_overrides(config_name, overrides)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name, add_free_form_keys(expand_group_shorthands(list(overrides), shorthands), free_form_mappings))
