"""Turn a composed Hydra config into a validated, typed one for each entry point."""

from __future__ import annotations

from omegaconf import DictConfig

from rlflow.config import ConfigError, validate_config
from rlflow.config.schema import PPOConfig, SFTConfig
from rlflow.engines.registry import get_engine_cls

# Where the `engine` group is mounted in each entry point's config.
PPO_ENGINE_MOUNTS = ("actor.engine", "critic.engine", "ref.engine", "reward.reward_model.engine")
SFT_ENGINE_MOUNTS = ("engine",)


def _engine_schema_resolver(path: str):
    def resolve(node: DictConfig) -> type:
        name = node.get("name")
        try:
            return get_engine_cls(name).config_class
        except (KeyError, ValueError) as error:
            raise ConfigError(f"config key '{path}.name': {error}") from None

    return resolve


def _load(cfg: DictConfig, schema: type, engine_mounts: tuple[str, ...]) -> DictConfig:
    return validate_config(cfg, schema, {path: _engine_schema_resolver(path) for path in engine_mounts})


def load_ppo_config(cfg: DictConfig) -> DictConfig:
    """Validate a composed ``ppo_trainer`` config; raises ``ConfigError`` naming the bad key."""
    return _load(cfg, PPOConfig, PPO_ENGINE_MOUNTS)


def load_sft_config(cfg: DictConfig) -> DictConfig:
    """Validate a composed ``sft_trainer`` config; raises ``ConfigError`` naming the bad key."""
    return _load(cfg, SFTConfig, SFT_ENGINE_MOUNTS)
