"""The PPO/GRPO driver: one controller process that moves ``DataProto`` batches between worker groups.

Each step: generate -> reward -> old log-probs -> ref log-probs (KL) -> values (GAE) ->
KL-in-reward -> advantages -> critic update -> actor update (controller loop, two worker
round trips per mini-batch) -> weight sync. An exactly on-policy update takes the old
log-probs from its own forward instead of a separate pass (``old_log_probs.py``). The
controller holds no model weights.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Iterator, Optional

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from rlflow.algos import apply_kl_penalty, compute_advantage, get_adv_estimator_fn, get_kl_controller
from rlflow.config import ConfigError
from rlflow.data.rl_dataset import build_rl_loader
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.meta_info import GLOBAL_STEP, METRICS, MINI_BATCH_SIZE, OLD_LOG_PROBS_FROM_UPDATE, SEED, TEMPERATURE, VALIDATE
from rlflow.models.ensure import ensure_model
from rlflow.models.loading import load_tokenizer
from rlflow.observability.tracking import Tracking
from rlflow.protocol import DataProto
from rlflow.rewards.manager import RewardManager
from rlflow.rollout import rollout_mismatch_metrics
from rlflow.trainer.batch_balance import balance_batch
from rlflow.trainer.checkpoint import CheckpointManager
from rlflow.trainer.divergence import DivergenceGuard
from rlflow.trainer.old_log_probs import in_batch_order, recompute_reason
from rlflow.trainer.placement import PlacedRoles, check_role_engines, check_role_model_folders, place_roles
from rlflow.trainer.ppo_metrics import data_metrics, throughput_metrics, validation_metrics
from rlflow.trainer.preemption import PreemptionFlag
from rlflow.trainer.response_scoring import ResponseScorer
from rlflow.trainer.run_folder import export_dir, open_run_folder
from rlflow.utils.logging import get_logger
from rlflow.utils.metric_values import mean_per_key
from rlflow.utils.seed import get_rng_state, set_rng_state, set_seed
from rlflow.utils.timer import timed
from rlflow.workers import init_ray, shutdown_ray

logger = get_logger(__name__)

ACTOR_UPDATE_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "old_log_probs", "advantages")
ROW_INDEX = "row_index"  # an on-policy update batch's row numbers, to put the update forward's outputs back in order


def run_ppo(config: DictConfig) -> None:
    """Train with a validated ``ppo_trainer`` config (see ``rlflow.trainer.main_ppo``)."""
    with open_run_folder(config):  # lock, writability, export folder, resume check: before Ray starts
        trainer = PPOTrainer(config)
        try:
            trainer.fit()
        finally:
            trainer.shutdown()


def _needs(estimator: str, input_name: str) -> bool:
    return input_name in inspect.signature(get_adv_estimator_fn(estimator)).parameters


class PPOTrainer:
    """The single controller of a PPO-family run: data, rewards, advantages and the step loop."""

    def __init__(self, config: DictConfig):
        self.config = config
        algo = config.algorithm
        self.use_critic = _needs(algo.adv_estimator, "values")
        self.use_ref = bool(algo.use_kl_in_reward or config.actor.use_kl_loss)
        self.needs_greedy_baseline = _needs(algo.adv_estimator, "reward_baselines")
        # keep a uid group's rows on one DP rank where that lowers the slowest rank's work (batch_balance.py)
        self.share_prefix = any(OmegaConf.select(config, f"{role}.engine.share_prefix", default=False)
                                for role in ("actor", "critic", "ref"))
        self.model_path = ensure_model(config.model, tokenizer_corpus())
        check_role_model_folders(config, self.use_critic)
        check_role_engines(config, self.model_path, self.use_ref, self.use_critic, self.world_size)
        self.tokenizer = load_tokenizer(config.model.tokenizer_path or self.model_path, config.model.trust_remote_code)
        self.train_loader = build_rl_loader(config.data, self.tokenizer, "train")
        self.val_loader = build_rl_loader(config.data, self.tokenizer, "val") if config.data.val_files else None
        self.total_steps = config.trainer.total_training_steps or len(self.train_loader) * config.trainer.total_epochs
        self._check_batch_sizes()
        self._fill_derived_config()
        self.kl_ctrl = get_kl_controller(algo.kl_ctrl)
        self.reward_manager = RewardManager(self.tokenizer, config.reward, config.trainer.timeouts.reward_s)
        self.scorer = ResponseScorer(self.reward_manager, config.reward)
        self.guard = DivergenceGuard.from_config(config)
        self.checkpoints = CheckpointManager.for_run(config)
        reason = recompute_reason(config, self.model_path)
        self.old_log_probs_from_update = reason is None
        logger.info("old log-probs: %s", "from the update's forward (exactly on-policy)" if reason is None
                    else f"a separate forward pass ({reason})")
        set_seed(config.trainer.seed)
        self.roles: Optional[PlacedRoles] = None
        self.tracking: Optional[Tracking] = None
        self._batches: Optional[Iterator[DataProto]] = None

    # ------------------------------------------------------------------ set-up
    @property
    def world_size(self) -> int:
        return self.config.trainer.nnodes * self.config.trainer.n_procs_per_node

    def _check_batch_sizes(self) -> None:
        """Every mini-batch must split evenly over the DP ranks, so no update sees padded rows."""
        cfg, n = self.config, self.config.rollout.n
        checks = [("actor", cfg.actor.ppo_mini_batch_size)] + ([("critic", cfg.critic.ppo_mini_batch_size)] if self.use_critic else [])
        for role, mini in checks:
            if cfg.data.train_batch_size % mini:
                raise ConfigError(f"config key '{role}.ppo_mini_batch_size': {mini} must divide data.train_batch_size "
                                  f"({cfg.data.train_batch_size})")
            if (mini * n) % self.world_size:
                raise ConfigError(f"config key '{role}.ppo_mini_batch_size': {mini} prompts x rollout.n={n} must divide "
                                  f"evenly over {self.world_size} worker processes")

    def _fill_derived_config(self) -> None:
        """The LR schedule length of each engine (``lr_scheduler.total_steps: 0``) from the run's length."""
        cfg = self.config
        updates_per_step = cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size * cfg.actor.ppo_epochs
        with open_dict(cfg):
            for role in ("actor", "critic"):
                schedule = cfg[role].engine.lr_scheduler
                if schedule.total_steps == 0:
                    schedule.total_steps = self.total_steps * updates_per_step

    def _start_workers(self) -> None:
        trainer = self.config.trainer
        init_ray(address=trainer.ray_address, num_cpus=trainer.ray_num_cpus, temp_dir=trainer.ray_temp_dir,
                 node_ip_address=trainer.ray_node_ip_address)
        self.roles = place_roles(self.config, self.model_path, self.use_ref, self.use_critic)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> None:
        """Run from the resumed (or first) step to ``total_steps``; validate, log, checkpoint, export.

        A step is logged before it is checkpointed, so a kill between the two loses no metrics
        row. SIGTERM checkpoints the current step and returns early (``PreemptionFlag``).
        """
        trainer = self.config.trainer
        self._start_workers()
        start_step = self._resume()
        self.tracking = Tracking(trainer.project_name, trainer.experiment_name, trainer.logger,
                                 OmegaConf.to_container(self.config), trainer.default_local_dir, self.total_steps)
        if trainer.val_before_train and start_step == 0 and self.val_loader is not None:
            self.tracking.log(self.validate(), step=0)
        with PreemptionFlag() as preemption:
            for step in range(start_step + 1, self.total_steps + 1):
                metrics = self.train_step(self._next_batch(), step)
                last = step == self.total_steps
                if self.val_loader is not None and (last or (trainer.test_freq > 0 and step % trainer.test_freq == 0)):
                    metrics.update(self.validate())
                self.tracking.log(metrics, step=step)
                if last or preemption.requested or (trainer.save_freq > 0 and step % trainer.save_freq == 0):
                    self.save_checkpoint(step)
                if preemption.requested and not last:
                    logger.warning("preempted after step %d: checkpoint saved; run the same command to resume", step)
                    return
        folder = export_dir(trainer)
        self.roles.actor.save_hf(str(folder))
        logger.info("exported the trained actor to %s", folder)
        if trainer.export_lora_adapter_dir:
            self.roles.actor.save_lora_adapter(trainer.export_lora_adapter_dir)
            logger.info("exported the actor's LoRA adapters to %s", trainer.export_lora_adapter_dir)

    def _next_batch(self) -> DataProto:
        while True:
            if self._batches is None:
                self._batches = iter(self.train_loader)
            batch = next(self._batches, None)
            if batch is not None:
                return batch
            self._batches = None  # epoch finished: the loader's next iteration is the next epoch

    def train_step(self, prompts: DataProto, step: int) -> dict[str, float]:
        """One PPO step on a batch of prompts; returns the step's metrics."""
        cfg, roles = self.config, self.roles
        timings: dict[str, float] = {}
        metrics: dict[str, float] = {}
        prompts.meta_info[GLOBAL_STEP.name] = step
        with timed("step", timings):
            with timed("gen", timings):
                batch = roles.rollout.generate_sequences(prompts)
            metrics.update(METRICS.pop(batch.meta_info))
            batch.meta_info = {TEMPERATURE.name: cfg.rollout.temperature, GLOBAL_STEP.name: step}
            batch = balance_batch(batch, self.world_size, self.share_prefix)
            with timed("reward", timings):
                batch.batch["token_level_scores"] = self._score(batch, metrics)
            update_actor = step > cfg.critic.warmup_steps or not self.use_critic
            reuse = self.old_log_probs_from_update and update_actor  # the update's forward gives the old log-probs
            with timed("log_probs_and_values", timings):
                for result in self._forward_passes(batch, old_log_probs=not reuse):
                    batch.union(result.get())
            with timed("adv", timings):
                metrics.update(self._compute_advantages(batch, prompts))
            if update_actor:  # the weight sync below wakes the engine again
                roles.free_rollout_memory(cfg.rollout)
            if self.use_critic:
                with timed("update_critic", timings):
                    metrics.update(self._update_critic(batch, step))
            if update_actor:
                with timed("update_actor", timings):
                    metrics.update(self._update_actor(batch, step, reuse))
                with timed("weight_sync", timings):
                    metrics.update(roles.sync_weights(cfg.rollout))
        metrics.update(rollout_mismatch_metrics(batch.batch["rollout_log_probs"], batch.batch["old_log_probs"],
                                                batch.batch["response_mask"]))
        metrics.update(data_metrics(batch, use_critic=self.use_critic))
        metrics.update({f"timing_s/{name}": seconds for name, seconds in timings.items()})
        metrics.update(throughput_metrics(batch, timings, self.world_size))
        metrics["training/global_step"] = step
        metrics["training/epoch"] = self.train_loader.epoch
        return metrics

    def _score(self, batch: DataProto, metrics: dict[str, float]) -> torch.Tensor:
        """Token-level scores: rule rewards, reward model or both (``ResponseScorer``); errors checked."""
        scores, score_metrics = self.scorer.score(batch, self.roles.reward_model)
        metrics.update(score_metrics)
        metrics.update(self.guard.check_reward_errors(int(metrics["reward/error_count"]), len(batch), self.scorer.scorer_name))
        return scores

    def _forward_passes(self, batch: DataProto, old_log_probs: bool) -> list:
        """Start the independent forward passes (old log-probs unless the update gives them, ref
        log-probs, values) at once.

        They are futures: with split placement the actor, reference and critic pools compute in
        parallel; colocated, each process runs them one after the other.
        """
        roles = self.roles
        passes = [roles.actor.compute_log_prob.future(batch)] if old_log_probs else []
        if self.use_ref:
            passes.append(roles.ref.compute_ref_log_prob.future(batch))
        if self.use_critic:
            passes.append(roles.critic.compute_values.future(batch))
        return passes

    def _compute_advantages(self, batch: DataProto, prompts: DataProto) -> dict[str, float]:
        algo, metrics = self.config.algorithm, {}
        scores = batch.batch["token_level_scores"]
        rewards = scores
        if algo.use_kl_in_reward:
            rewards, metrics = apply_kl_penalty(scores, batch.batch["old_log_probs"], batch.batch["ref_log_prob"],
                                                batch.batch["response_mask"], self.kl_ctrl, algo.kl_penalty)
        batch.batch["token_level_rewards"] = rewards
        advantages, returns = compute_advantage(
            algo.adv_estimator,
            token_level_rewards=rewards,
            response_mask=batch.batch["response_mask"],
            values=batch.batch.get("values"),
            index=batch.non_tensor_batch["uid"],
            reward_baselines=self._greedy_baselines(prompts, batch) if self.needs_greedy_baseline else None,
            gamma=algo.gamma,
            lam=algo.lam,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        )
        batch.batch["advantages"], batch.batch["returns"] = advantages, returns
        return metrics

    def _greedy_baselines(self, prompts: DataProto, batch: DataProto) -> torch.Tensor:
        """ReMax's baseline: the reward of each prompt's greedy response, matched to the batch rows by uid."""
        greedy_prompts = prompts.select()
        greedy_prompts.meta_info[VALIDATE.name] = True
        greedy = self.roles.rollout.generate_sequences(greedy_prompts)
        METRICS.pop(greedy.meta_info)
        scores, _ = self.reward_manager(greedy)
        by_uid = dict(zip(greedy.non_tensor_batch["uid"].tolist(), scores.sum(-1).tolist()))
        return torch.tensor([by_uid[uid] for uid in batch.non_tensor_batch["uid"].tolist()], dtype=torch.float32)

    def _update_actor(self, batch: DataProto, step: int, old_log_probs_from_update: bool) -> dict[str, float]:
        """PPO epochs x shuffled mini-batches: ``forward_backward`` then ``optim_step`` for each.

        With ``old_log_probs_from_update`` (one epoch, one mini-batch) the loss takes the forward's
        own log-probs as old, and they and its entropy become the batch's ``old_log_probs`` and
        ``entropys``, in batch row order.
        """
        actor_cfg = self.config.actor
        keys = ACTOR_UPDATE_KEYS + (("ref_log_prob",) if actor_cfg.use_kl_loss else ())
        if old_log_probs_from_update:
            keys = tuple(key for key in keys if key != "old_log_probs")
        update = batch.select(batch_keys=keys, non_tensor_batch_keys=[], meta_info_keys=[TEMPERATURE.name])
        if old_log_probs_from_update:
            update.batch[ROW_INDEX] = torch.arange(len(update))
            update.meta_info[OLD_LOG_PROBS_FROM_UPDATE.name] = True
        mini_batch = actor_cfg.ppo_mini_batch_size * self.config.rollout.n
        step_metrics, guard_metrics = [], {}
        for mini in update.make_iterator(mini_batch, actor_cfg.ppo_epochs, actor_cfg.shuffle, seed=self.config.trainer.seed + step):
            outputs = self.roles.actor.forward_backward(mini)
            optim = self.roles.actor.optim_step()[0]
            guard_metrics = self.guard.check_optim_step("actor", optim["actor/skipped"] > 0)
            step_metrics.append({**METRICS.read(outputs.meta_info), **optim})
        if old_log_probs_from_update:  # exactly one mini-batch: ``mini`` and ``outputs`` cover the whole batch
            forward = in_batch_order(outputs, mini.batch[ROW_INDEX])
            batch.batch.update(old_log_probs=forward.batch["log_probs"], entropys=forward.batch["entropy"])
        return {**mean_per_key(step_metrics), **guard_metrics}

    def _update_critic(self, batch: DataProto, step: int) -> dict[str, float]:
        update = batch.select(batch_keys=ACTOR_UPDATE_KEYS[:5] + ("values", "returns"), non_tensor_batch_keys=[])
        update.meta_info = {MINI_BATCH_SIZE.name: self.config.critic.ppo_mini_batch_size * self.config.rollout.n,
                            SEED.name: self.config.trainer.seed + step}
        metrics = self.roles.critic.update_critic(update)  # its optimizer steps run in the worker: checked together
        return {**metrics, **self.guard.check_optim_steps("critic", int(metrics["critic/optim_steps"]),
                                                          int(metrics["critic/trailing_skipped_steps"]))}

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Generate with ``rollout.val_kwargs`` on the val files; verl's ``val-core/<data_source>/...`` metrics."""
        start = time.perf_counter()
        outputs, results = [], []
        for prompts in self.val_loader:
            prompts.meta_info.update({VALIDATE.name: True, GLOBAL_STEP.name: 0})
            generated = self.roles.rollout.generate_sequences(prompts)
            METRICS.pop(generated.meta_info)
            generated.batch["token_level_scores"], _, batch_results = self.reward_manager.score_with_results(generated)
            outputs.append(generated)
            results.extend(batch_results)
        metrics = validation_metrics(DataProto.concat(outputs), results)
        metrics["timing_s/validate"] = time.perf_counter() - start
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int) -> None:
        """Worker checkpoints plus driver state under ``global_step_{step}``, atomically."""
        roles = self.roles

        def save_workers(folder: Path) -> None:
            roles.actor.save_checkpoint(str(folder / "actor"))
            if self.use_critic:
                roles.critic.save_checkpoint(str(folder / "critic"))

        state = {"global_step": step, "dataloader": self.train_loader.state_dict(), "kl_coef": self.kl_ctrl.value,
                 "rng": get_rng_state(), "divergence_guard": self.guard.state_dict()}
        path = self.checkpoints.save(step, state, save_workers)
        logger.info("saved checkpoint %s", path)

    def _resume(self) -> int:
        """Load the checkpoint ``trainer.resume_mode`` selects; returns the step it was taken at (0: none)."""
        trainer = self.config.trainer
        folder = self.checkpoints.resolve(trainer.resume_mode, trainer.resume_from_path)
        if folder is None:
            return 0
        state = self.checkpoints.load_driver_state(folder, ("global_step", "dataloader", "kl_coef", "rng", "divergence_guard"))
        self.roles.actor.load_checkpoint(str(folder / "actor"))
        if self.use_critic:
            self.roles.critic.load_checkpoint(str(folder / "critic"))
        self.roles.sync_weights(self.config.rollout)
        self.train_loader.load_state_dict(state["dataloader"])
        self.kl_ctrl.value = state["kl_coef"]
        self.guard.load_state_dict(state["divergence_guard"])
        set_rng_state(state["rng"])
        logger.info("resumed from %s (step %d)", folder, state["global_step"])
        return int(state["global_step"])

    def shutdown(self) -> None:
        """Finish the trackers, stop the worker groups and the reward pool, leave Ray."""
        if self.tracking is not None:
            self.tracking.finish()
        self.reward_manager.close()
        if self.roles is not None:
            self.roles.shutdown()
        shutdown_ray()
