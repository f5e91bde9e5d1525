"""The phases of a PPO step, and ``run_step``, the synchronous step that calls them in order.

| module | phases | reads -> writes (batch columns) |
|---|---|---|
| ``generate`` | ``Generate``, ``Balance``, ``GreedyBaselines`` (ReMax) | prompts -> the rollout's columns; row order; ``uid`` -> ``reward_baselines`` |
| ``scoring`` | ``Score`` | responses (+ rule-reward columns) -> ``token_level_scores`` |
| ``forward_passes`` | ``OLD_LOG_PROBS``, ``REF_LOG_PROBS``, ``VALUES`` | model inputs -> ``old_log_probs``/``entropys``, ``ref_log_prob``, ``values`` |
| ``rollout_correction`` | ``RolloutCorrection`` | decoupled: old + rollout log-probs -> ``response_mask`` (rejection), ``rollout_is_weights``; bypass: ``rollout_log_probs`` -> ``old_log_probs`` |
| ``advantages`` | ``Advantages`` | scores (+ KL inputs, values, baselines) -> ``token_level_rewards``, ``advantages``, ``returns`` |
| ``updates`` | ``CriticUpdate``, ``ActorUpdate`` | model inputs + values/returns; + old log-probs/advantages (+ ``rollout_is_weights``) -> (on-policy: ``old_log_probs``, ``entropys``) |
| ``sync`` | ``RolloutSleep``, ``WeightSync``, ``LiveWeightSync`` (partial rollouts) | nothing (the rollout engines' memory and weights) |
| ``validate`` | ``validate`` (a function over the val loader) | val prompts -> ``val-core/...`` metrics |

``base`` holds the contract (``Phase``, ``RolePass``, ``BatchKeys``) and ``StepRecord``; ``context``
holds ``RunPlan``, ``PhaseContext`` and ``StepState``; ``step`` holds ``run_step``. See docs/layout.md,
"The PPO step in phases".
"""

from rlflow.trainer.phases.context import PhaseContext, RunPlan, StepState
from rlflow.trainer.phases.step import run_step
from rlflow.trainer.phases.validate import validate

__all__ = ["PhaseContext", "RunPlan", "StepState", "run_step", "validate"]
