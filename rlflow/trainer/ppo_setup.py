"""Set-up of a PPO run: everything before the first step.

``prepare_run`` does all of it before Ray starts, so bad input stops the run with one line: the
model folder, the run's plan (``RunPlan``), each role's model folder and engine, the data loaders,
the batch sizes, the derived config, the scorers, the divergence guard, the KL controller and the
checkpoint manager. ``start_roles`` then starts Ray, places the roles on worker groups and returns
the ``PhaseContext`` the steps run with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, open_dict

from rlflow.algos import KLController, get_kl_controller
from rlflow.algos.rollout_correction import BYPASS, DECOUPLED
from rlflow.config import ConfigError
from rlflow.config.loading.auto_settings import RunKeys, speed_settings_line
from rlflow.data.rl_dataset import build_rl_loader
from rlflow.rollout.agent.checks import check_agent_names, tool_schemas
from rlflow.data.sampler import BatchLoader
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.engines.common.optim.lr_schedulers import fit_schedule_to_run
from rlflow.models.ensure import ensure_model
from rlflow.models.loading import load_tokenizer
from rlflow.rewards.manager import RewardManager
from rlflow.rollout.tensor_parallel import check_tensor_parallel_model
from rlflow.trainer.checkpoint import CheckpointManager
from rlflow.trainer.divergence import DivergenceGuard
from rlflow.trainer.phases.context import PhaseContext, RunPlan
from rlflow.trainer.placement import check_role_engines, check_role_model_folders, place_roles
from rlflow.trainer.response_scoring import ResponseScorer
from rlflow.utils.logging import get_logger
from rlflow.utils.seed import set_seed
from rlflow.workers import init_cluster

__all__ = ["PPOSetup", "prepare_run", "start_roles"]

logger = get_logger(__name__)
# Where main_ppo's config says how long the run is, how many rows share a prompt, and where the rollout is.
PPO_RUN_KEYS = RunKeys(group_size="rollout.n", rollout="rollout")


@dataclass
class PPOSetup:
    """What ``prepare_run`` builds before Ray starts."""

    config: DictConfig
    plan: RunPlan
    model_path: Path
    train_loader: BatchLoader
    val_loader: Optional[BatchLoader]
    total_steps: int
    reward_manager: RewardManager
    scorer: ResponseScorer
    guard: DivergenceGuard
    kl_ctrl: KLController
    checkpoints: CheckpointManager


def prepare_run(config: DictConfig) -> PPOSetup:
    """Check and build a run from a validated ``ppo_trainer`` config; a ``UserError`` names bad input.

    Fills the derived config keys in place (``fill_derived_config``) and seeds the driver's RNGs last.
    """
    model_path = ensure_model(config.model, tokenizer_corpus())
    plan = RunPlan.from_config(config, model_path)
    check_role_model_folders(config, plan.use_critic)
    check_role_engines(config, model_path, plan.use_ref, plan.use_critic, plan.world_size)
    check_tensor_parallel_model(int(config.rollout.tensor_parallel_size), model_path)
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_path, config.model.trust_remote_code)
    tools = tool_schemas(config.rollout.multi_turn)
    train_loader = build_rl_loader(config.data, tokenizer, "train", tools)
    val_loader = build_rl_loader(config.data, tokenizer, "val", tools) if config.data.val_files else None
    for key, loader in (("data.train_files", train_loader), ("data.val_files", val_loader)):
        if loader is not None:
            check_agent_names((row.agent_name for row in loader.dataset.rows), config.rollout.multi_turn, key)
    total_steps = config.trainer.total_training_steps or len(train_loader) * config.trainer.total_epochs
    check_batch_sizes(config, plan)
    fill_derived_config(config, total_steps)
    kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl)
    reward_manager = RewardManager(tokenizer, config.reward, config.trainer.timeouts.reward_s)
    scorer = ResponseScorer(reward_manager, config.reward)
    guard = DivergenceGuard.from_config(config)
    checkpoints = CheckpointManager.for_run(config)
    logger.info("old log-probs: %s", old_log_probs_source(plan))
    roles = ["actor", *(["ref"] if plan.use_ref else []), *(["critic"] if plan.use_critic else []),
             *(["reward.reward_model"] if config.reward.reward_model.enable else [])]
    logger.info(speed_settings_line(config, [f"{role}.engine" for role in roles], PPO_RUN_KEYS))
    set_seed(config.trainer.seed)
    return PPOSetup(config, plan, model_path, train_loader, val_loader, total_steps, reward_manager, scorer,
                    guard, kl_ctrl, checkpoints)


def old_log_probs_source(plan: RunPlan) -> str:
    """Where this run's old log-probs come from, and why (the start-up log line)."""
    if plan.old_log_probs_from_update:
        corrected = "; the loss computes the rollout IS weights from them" if plan.rollout_correction == DECOUPLED else ""
        return f"from the update's forward (exactly on-policy){corrected}"
    if plan.rollout_correction == BYPASS:
        return f"the rollout's, no separate pass ({plan.recompute_reason})"
    return f"a separate forward pass ({plan.recompute_reason})"


def check_batch_sizes(config: DictConfig, plan: RunPlan) -> None:
    """Every mini-batch must split evenly over the DP ranks, so no update sees padded rows."""
    n, world_size = config.rollout.n, plan.world_size
    checks = [("actor", config.actor.ppo_mini_batch_size)]
    checks += [("critic", config.critic.ppo_mini_batch_size)] if plan.use_critic else []
    for role, mini in checks:
        if config.data.train_batch_size % mini:
            raise ConfigError(f"config key '{role}.ppo_mini_batch_size': {mini} must divide data.train_batch_size "
                              f"({config.data.train_batch_size})")
        if (mini * n) % world_size:
            raise ConfigError(f"config key '{role}.ppo_mini_batch_size': {mini} prompts x rollout.n={n} must divide "
                              f"evenly over {world_size} worker processes")


def fill_derived_config(config: DictConfig, total_steps: int) -> None:
    """The LR schedule of each trained engine fitted to the run's optimizer steps (``fit_schedule_to_run``)."""
    with open_dict(config):
        for role in ("actor", "critic"):
            mini_batches = max(1, config.data.train_batch_size // config[role].ppo_mini_batch_size)
            updates_per_step = mini_batches * config[role].ppo_epochs
            note = fit_schedule_to_run(config[role].engine.lr_scheduler, total_steps * updates_per_step,
                                       f"{role}.engine.lr_scheduler")
            if note is not None:
                logger.warning(note)


def start_roles(setup: PPOSetup) -> PhaseContext:
    """Start Ray and the worker groups ``trainer.placement`` asks for; the context the steps run with."""
    config, plan = setup.config, setup.plan
    init_cluster(config.trainer)
    roles = place_roles(config, setup.model_path, plan.use_ref, plan.use_critic)
    return PhaseContext(config, plan, roles, setup.reward_manager, setup.scorer, setup.guard, setup.kl_ctrl)
