"""What ``--validate`` runs for each driver after config loading: the rest of its checks before Ray starts.

A run makes these checks on its way to Ray; ``--validate`` (``rlflow.config.loading.entry_point``)
makes them alone and stops: the run folder (``check_run_folder``: writable, not locked, a
resumable checkpoint; nothing created), then the driver's own set-up up to the point where it
would start Ray (model folders and engines against the ranks, tokenizer, every data file, batch
sizes). A model preset the config names is built on first use, as the run would build it (a
cache under outputs/models, not the run folder).
"""

from __future__ import annotations

import os

from omegaconf import DictConfig

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.ensure import ensure_model
from rlflow.trainer.ppo_setup import prepare_run
from rlflow.trainer.run_folder import check_run_folder
from rlflow.trainer.sft_trainer import prepare_sft_run


def preflight_ppo(config: DictConfig) -> None:
    """``main_ppo``'s pre-Ray checks: the run folder, then the run's set-up (``prepare_run``: no worker starts)."""
    check_run_folder(config)
    prepare_run(config)


def sft_world_size(config: DictConfig) -> int:
    """The ranks an SFT run trains on: the Ray workers, or the processes ``torchrun`` starts (its WORLD_SIZE)."""
    trainer = config.trainer
    if trainer.launcher == "torchrun":
        return int(os.environ.get("WORLD_SIZE", "1"))
    return trainer.nnodes * trainer.n_procs_per_node


def preflight_sft(config: DictConfig) -> None:
    """``main_sft``'s pre-Ray checks: the run folder, the model folder, the engine against the ranks, the data."""
    check_run_folder(config)
    prepare_sft_run(config, ensure_model(config.model, tokenizer_corpus()), sft_world_size(config))
