"""The score phase: the token-level scores of the responses, checked by the divergence guard."""

from __future__ import annotations

from rlflow.meta_info import METRICS
from rlflow.protocol import DataProto
from rlflow.trainer.phases.base import BatchKeys, Phase
from rlflow.trainer.phases.columns import MODEL_INPUTS, RULE_REWARD_INPUTS
from rlflow.trainer.phases.context import PhaseContext, StepState

__all__ = ["Score"]


class Score(Phase):
    """``token_level_scores`` ``[B, R]`` from the rule rewards, the reward model or both (``ResponseScorer``).

    More failed samples than ``reward.max_error_fraction`` stop the run (``DivergenceGuard.check_reward_errors``).
    """

    name = "score"
    writes = ("token_level_scores",)

    def keys(self, ctx: PhaseContext, state: StepState) -> BatchKeys:
        scorer = ctx.scorer
        reads = (RULE_REWARD_INPUTS if scorer.use_rules else ()) + (MODEL_INPUTS if scorer.use_reward_model else ())
        return BatchKeys(tuple(dict.fromkeys(reads)), self.writes)

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        scores, metrics = ctx.scorer.score(batch, ctx.roles.reward_model)
        errors = ctx.guard.check_reward_errors(int(metrics["reward/error_count"]), len(batch), ctx.scorer.scorer_name)
        return DataProto.from_dict({"token_level_scores": scores}, meta_info={METRICS.name: {**metrics, **errors}})
