"""PPO/GRPO entry point: ``python -m rlflow.trainer.main_ppo key=value ...``.

``--validate`` runs every pre-Ray check and prints the resolved config; ``--cfg job`` is Hydra's printer of the
composed config; ``actor.engine=fsdp`` picks an engine
for a role (shorthand for Hydra's ``engine@actor.engine=fsdp``).
"""

from __future__ import annotations

from rlflow.trainer.entry_points import PPO_ENTRY
from rlflow.trainer.ppo_trainer import run_ppo
from rlflow.trainer.run_folder import route_worker_logs


def main() -> None:
    PPO_ENTRY.run(lambda config: run_ppo(route_worker_logs(config)))


if __name__ == "__main__":
    main()
