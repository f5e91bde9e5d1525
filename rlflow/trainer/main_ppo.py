"""PPO/GRPO entry point: ``python -m rlflow.trainer.main_ppo key=value ...``.

``--cfg job`` prints the composed config; ``actor.engine=fsdp`` picks an engine
for a role (shorthand for Hydra's ``engine@actor.engine=fsdp``).
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlflow.trainer.config_loading import PPO_GROUP_SHORTHANDS, load_ppo_config
from rlflow.trainer.entry import run_hydra_entry


def run(cfg: DictConfig) -> None:
    """Validate the config and train."""
    config = load_ppo_config(cfg)
    from rlflow.trainer.ppo_trainer import run_ppo

    run_ppo(config)


def main() -> None:
    run_hydra_entry("ppo_trainer", run, PPO_GROUP_SHORTHANDS)


if __name__ == "__main__":
    main()
