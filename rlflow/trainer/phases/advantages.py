"""The advantage phase: the KL penalty in the reward (when on), then the configured advantage estimator."""

from __future__ import annotations

from rlflow.algos import apply_kl_penalty, compute_advantage
from rlflow.meta_info import METRICS
from rlflow.protocol import DataProto
from rlflow.trainer.phases.base import BatchKeys, Phase
from rlflow.trainer.phases.context import PhaseContext, StepState

__all__ = ["Advantages"]


class Advantages(Phase):
    """``token_level_rewards`` (the scores, less the KL penalty with ``algorithm.use_kl_in_reward``), and
    ``advantages`` and ``returns`` from ``algorithm.adv_estimator`` (``rlflow.algos.compute_advantage``).

    GAE reads the critic's ``values``, ReMax the ``reward_baselines`` of ``GreedyBaselines``; every
    estimator groups rows by ``uid``.
    """

    name = "advantages"
    writes = ("token_level_rewards", "advantages", "returns")

    def keys(self, ctx: PhaseContext, state: StepState) -> BatchKeys:
        plan = ctx.plan
        reads = ("token_level_scores", "response_mask", "uid")
        reads += ("old_log_probs", "ref_log_prob") if ctx.config.algorithm.use_kl_in_reward else ()
        reads += ("values",) if plan.use_critic else ()
        reads += ("reward_baselines",) if plan.needs_greedy_baseline else ()
        return BatchKeys(reads, self.writes)

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        algo, data = ctx.config.algorithm, batch.batch
        rewards, metrics = data["token_level_scores"], {}
        if algo.use_kl_in_reward:
            rewards, metrics = apply_kl_penalty(rewards, data["old_log_probs"], data["ref_log_prob"], data["response_mask"],
                                                ctx.kl_ctrl, algo.kl_penalty)
        advantages, returns = compute_advantage(
            algo.adv_estimator,
            token_level_rewards=rewards,
            response_mask=data["response_mask"],
            values=data.get("values"),
            index=batch.non_tensor_batch["uid"],
            reward_baselines=data.get("reward_baselines"),
            gamma=algo.gamma,
            lam=algo.lam,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        )
        return DataProto.from_dict({"token_level_rewards": rewards, "advantages": advantages, "returns": returns},
                                   meta_info={METRICS.name: metrics})
