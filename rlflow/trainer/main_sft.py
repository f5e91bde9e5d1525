"""SFT entry point: ``python -m rlflow.trainer.main_sft engine=fsdp2 data.train_files=[...] key=value ...``.

Two launchers (``trainer.launcher``, ``sft_launchers.py``) run the same ``SFTWorker`` code and the same loop:
``ray`` (default; this process is the controller of a ``RayWorkerGroup``) and ``torchrun``
(``torchrun --nproc_per_node N -m rlflow.trainer.main_sft trainer.launcher=torchrun ...``).

See docs/sft.md.
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlflow.trainer.entry_points import SFT_ENTRY
from rlflow.trainer.run_folder import route_worker_logs
from rlflow.trainer.sft_launchers import LAUNCHER_REGISTRY, History


def launch(config: DictConfig) -> History:
    """Train with a validated ``sft_trainer`` config and its ``trainer.launcher``."""
    return LAUNCHER_REGISTRY.get(config.trainer.launcher)(config)


def run_sft(config: DictConfig) -> History:
    """Validate a composed ``sft_trainer`` config (the launcher among them) and the machine it runs on, then ``launch`` it."""
    return launch(SFT_ENTRY.check_machine(SFT_ENTRY.load(config)))


def main() -> None:
    SFT_ENTRY.run(lambda config: launch(route_worker_logs(config)))


if __name__ == "__main__":
    main()
