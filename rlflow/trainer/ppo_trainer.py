"""The PPO/GRPO driver loop: one controller process that moves ``DataProto`` batches between worker groups.

``PPOTrainer`` sets the run up (``ppo_setup``: all checks before Ray, then the roles), resumes
(``ppo_checkpoints``), and runs the steps through the training mode ``async_training.mode`` names
(``training_modes.py``; each step is ``run_step``, ``phases/step.py``: generate -> score -> log-probs
and values -> advantages -> critic and actor updates -> weight sync), with validation, logging,
checkpoints and the final export around them. The controller holds no model weights.
"""

from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig, OmegaConf

from rlflow.observability.tracking import Tracking
from rlflow.trainer.phases import PhaseContext, validate
from rlflow.trainer.phases.context import updates_before
from rlflow.trainer.ppo_checkpoints import export_actor, resume, save_step
from rlflow.trainer.ppo_setup import prepare_run, start_roles
from rlflow.trainer.preemption import PreemptionFlag
from rlflow.trainer.run_folder import open_run_folder
from rlflow.trainer.training_modes import TRAINING_MODE_REGISTRY, BatchSource
from rlflow.utils.logging import get_logger
from rlflow.workers import shutdown_ray

logger = get_logger(__name__)


def run_ppo(config: DictConfig) -> None:
    """Train with a validated ``ppo_trainer`` config (see ``rlflow.trainer.main_ppo``)."""
    with open_run_folder(config):  # lock, writability, export folder, resume check: before Ray starts
        trainer = PPOTrainer(config)
        try:
            trainer.fit()
        finally:
            trainer.shutdown()


class PPOTrainer:
    """The single controller of a PPO-family run: set-up in the constructor (bad input raises a
    ``UserError`` before Ray starts), then ``fit``."""

    def __init__(self, config: DictConfig):
        self.config = config
        self.setup = prepare_run(config)
        self.ctx: Optional[PhaseContext] = None
        self.tracking: Optional[Tracking] = None

    def fit(self) -> None:
        """Run from the resumed (or first) step to the last; validate, log, checkpoint, export.

        A step is logged before it is checkpointed, so a kill between the two loses no metrics
        row. SIGTERM checkpoints the current step and returns early (``PreemptionFlag``).
        """
        setup, trainer = self.setup, self.config.trainer
        self.ctx = ctx = start_roles(setup)
        start_step = resume(setup, ctx)
        self.tracking = Tracking(trainer.project_name, trainer.experiment_name, trainer.logger,
                                 OmegaConf.to_container(self.config), trainer.default_local_dir, setup.total_steps)
        if trainer.val_before_train and start_step == 0 and setup.val_loader is not None:
            self.tracking.log(validate(ctx, setup.val_loader, version=0), step=0)
        steps = TRAINING_MODE_REGISTRY.get(self.config.async_training.mode)(
            ctx, BatchSource(setup.train_loader), range(start_step + 1, setup.total_steps + 1))
        with PreemptionFlag() as preemption:
            for trained in steps:
                step, metrics = trained.step, trained.metrics
                last = step == setup.total_steps
                if setup.val_loader is not None and (last or (trainer.test_freq > 0 and step % trainer.test_freq == 0)):
                    metrics.update(validate(ctx, setup.val_loader, updates_before(ctx, step + 1)))
                self.tracking.log(metrics, step=step)
                if last or preemption.requested or (trainer.save_freq > 0 and step % trainer.save_freq == 0):
                    save_step(setup, ctx, step, trained.loader_state)
                if preemption.requested and not last:
                    logger.warning("preempted after step %d: checkpoint saved; run the same command to resume", step)
                    return
        export_actor(ctx)

    def shutdown(self) -> None:
        """Finish the trackers, stop the worker groups and the reward pool, leave Ray."""
        if self.tracking is not None:
            self.tracking.finish()
        self.setup.reward_manager.close()
        if self.ctx is not None:
            self.ctx.roles.shutdown()
        shutdown_ray()
