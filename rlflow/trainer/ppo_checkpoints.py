"""The PPO driver's run state on disk: save a step, resume from a checkpoint, export the trained actor.

A step's checkpoint is the actor's (and critic's) engine checkpoint plus the driver state:
the data loader's position, the KL coefficient, the RNG states and the divergence guard's counts
(``rlflow.trainer.checkpoint`` writes it atomically).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlflow.trainer.phases.context import PhaseContext, updates_before
from rlflow.trainer.ppo_setup import PPOSetup
from rlflow.trainer.run_folder import export_dir
from rlflow.utils.logging import get_logger
from rlflow.utils.seed import get_rng_state, set_rng_state

__all__ = ["DRIVER_STATE_KEYS", "export_actor", "resume", "save_step"]

logger = get_logger(__name__)

DRIVER_STATE_KEYS = ("global_step", "dataloader", "kl_coef", "rng", "divergence_guard")


def save_step(setup: PPOSetup, ctx: PhaseContext, step: int, loader_state: dict[str, Any]) -> None:
    """Worker checkpoints plus driver state under ``global_step_{step}``, atomically; ``loader_state`` is the
    loader's position after this step's batch (the loader may have given later batches since)."""
    roles = ctx.roles

    def save_workers(folder: Path) -> None:
        roles.actor.save_checkpoint(str(folder / "actor"))
        if ctx.plan.use_critic:
            roles.critic.save_checkpoint(str(folder / "critic"))

    state = {"global_step": step, "dataloader": loader_state, "kl_coef": ctx.kl_ctrl.value,
             "rng": get_rng_state(), "divergence_guard": ctx.guard.state_dict()}
    path = setup.checkpoints.save(step, state, save_workers)
    logger.info("saved checkpoint %s", path)


def resume(setup: PPOSetup, ctx: PhaseContext) -> int:
    """Load the checkpoint ``trainer.resume_mode`` selects; returns the step it was taken at (0: none)."""
    trainer = setup.config.trainer
    folder = setup.checkpoints.resolve(trainer.resume_mode, trainer.resume_from_path)
    if folder is None:
        return 0
    state = setup.checkpoints.load_driver_state(folder, DRIVER_STATE_KEYS)
    ctx.roles.actor.load_checkpoint(str(folder / "actor"))
    if ctx.plan.use_critic:
        ctx.roles.critic.load_checkpoint(str(folder / "critic"))
    ctx.roles.sync_weights(setup.config.rollout, updates_before(ctx, int(state["global_step"]) + 1))
    setup.train_loader.load_state_dict(state["dataloader"])
    ctx.kl_ctrl.value = state["kl_coef"]
    ctx.guard.load_state_dict(state["divergence_guard"])
    set_rng_state(state["rng"])
    logger.info("resumed from %s (step %d)", folder, state["global_step"])
    return int(state["global_step"])


def export_actor(ctx: PhaseContext) -> None:
    """The trained actor as an HF folder (``trainer.export_dir``), and its LoRA adapters where asked."""
    trainer = ctx.config.trainer
    folder = export_dir(trainer)
    ctx.roles.actor.save_hf(str(folder))
    logger.info("exported the trained actor to %s", folder)
    if trainer.export_lora_adapter_dir:
        ctx.roles.actor.save_lora_adapter(trainer.export_lora_adapter_dir)
        logger.info("exported the actor's LoRA adapters to %s", trainer.export_lora_adapter_dir)
