"""What the phases of a PPO step work with: the run's plan, the run-wide context, and one step's state.

``RunPlan`` (fixed by the config at set-up, before Ray) says which passes a step makes;
``PhaseContext`` adds the objects every phase may use (the placed roles, the reward scorers, the
divergence guard, the KL controller); ``StepState`` is what one batch's step decides (its number,
its prompts, whether the actor updates). A loop builds one ``PhaseContext`` per run and one
``StepState`` per batch, so batches of different steps can be in flight at once.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from rlflow.algos import KLController, get_adv_estimator_fn
from rlflow.algos.rollout_correction import correction_mode, correction_settings
from rlflow.protocol import DataProto
from rlflow.rewards.manager import RewardManager
from rlflow.trainer.divergence import DivergenceGuard
from rlflow.trainer.old_log_probs import recompute_reason
from rlflow.trainer.placement import PlacedRoles
from rlflow.trainer.response_scoring import ResponseScorer

__all__ = ["PhaseContext", "RunPlan", "StepState"]


def _estimator_takes(estimator: str, input_name: str) -> bool:
    return input_name in inspect.signature(get_adv_estimator_fn(estimator)).parameters


@dataclass(frozen=True)
class RunPlan:
    """Which roles and passes a run's steps use; fixed by the config at set-up."""

    use_critic: bool  # the advantage estimator takes values (GAE): a critic computes and learns them
    use_ref: bool  # a KL penalty in the reward or a KL loss: a reference computes ``ref_log_prob``
    needs_greedy_baseline: bool  # the estimator takes reward baselines (ReMax): a greedy generate per step
    share_prefix: bool  # some role's engine shares prompt prefixes: balance keeps uid groups on one rank
    world_size: int  # worker processes of the run
    recompute_reason: Optional[str]  # why the update's forward cannot give the old log-probs (None: it gives them)
    rollout_correction: Optional[str]  # DECOUPLED | BYPASS: a RolloutCorrection phase runs (rlflow.algos.rollout_correction)

    @property
    def old_log_probs_from_update(self) -> bool:
        """Whether an updating step takes its old log-probs from the update's forward (``old_log_probs.py``)."""
        return self.recompute_reason is None

    @classmethod
    def from_config(cls, config: DictConfig, model_path: Optional[str | Path]) -> "RunPlan":
        """The plan of a validated ``ppo_trainer`` config; ``model_path`` is checked for dropout
        (``old_log_probs.recompute_reason``)."""
        algo = config.algorithm
        return cls(
            use_critic=_estimator_takes(algo.adv_estimator, "values"),
            use_ref=bool(algo.use_kl_in_reward or config.actor.use_kl_loss),
            needs_greedy_baseline=_estimator_takes(algo.adv_estimator, "reward_baselines"),
            share_prefix=any(OmegaConf.select(config, f"{role}.engine.share_prefix", default=False)
                             for role in ("actor", "critic", "ref")),
            world_size=config.trainer.nnodes * config.trainer.n_procs_per_node,
            recompute_reason=recompute_reason(config, model_path),
            rollout_correction=correction_mode(correction_settings(algo.rollout_correction)),
        )


@dataclass
class PhaseContext:
    """Everything the phases of one run share; built once the roles are placed."""

    config: DictConfig
    plan: RunPlan
    roles: PlacedRoles
    reward_manager: RewardManager  # rule/custom rewards (validation and ReMax's baseline use it alone)
    scorer: ResponseScorer  # the training batch's scores: rule rewards, reward model, or both
    guard: DivergenceGuard
    kl_ctrl: KLController


@dataclass(frozen=True)
class StepState:
    """One batch's step: its number, its prompts, and what this step runs."""

    step: int
    prompts: DataProto  # the step's prompts as the loader gave them (ReMax generates them again, greedily)
    update_actor: bool  # past the critic's warm-up (``critic.warmup_steps``), or no critic
    old_log_probs_from_update: bool  # this step's actor update gives the old log-probs (no separate pass)
    policy_version: int  # the trainer's policy version: the actor updates before this step (``updates_before``)

    @classmethod
    def begin(cls, ctx: PhaseContext, prompts: DataProto, step: int) -> "StepState":
        """The state of step ``step`` on ``prompts`` under ``ctx``'s plan."""
        update_actor = step > ctx.config.critic.warmup_steps or not ctx.plan.use_critic
        return cls(step, prompts, update_actor, ctx.plan.old_log_probs_from_update and update_actor,
                   updates_before(ctx, step))


def updates_before(ctx: PhaseContext, step: int) -> int:
    """The actor updates of the steps before step ``step`` (a critic's warm-up steps update no actor)."""
    warmup = ctx.config.critic.warmup_steps if ctx.plan.use_critic else 0
    return max(0, step - 1 - warmup)

