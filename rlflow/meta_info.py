"""The schema of ``DataProto.meta_info``: every key that crosses a process boundary, in one place.

A batch's ``meta_info`` travels with it through Ray (``rlflow.protocol``). Code that writes or reads
one of these keys names it through its ``MetaKey`` below (``TEMPERATURE.read(data.meta_info)``,
``{TEMPERATURE.name: 0.7}``), never as a bare string, so one grep finds every writer and reader and
every reader converts and defaults the value the same way. ``tests/protocol/test_meta_info.py``
fails on a bare-string ``meta_info`` key anywhere in ``rlflow/``.

| key | type (default) | written by | read by |
|---|---|---|---|
| ``temperature`` | float (1.0) | the PPO generate phase; roles, for their engine | log-prob forwards (``Actor``, ``Reference``), the engines' micro-batch forward |
| ``compute_entropy`` | bool (False) | roles, for their engine | the engines' micro-batch forward |
| ``global_step`` | int (0) | the PPO generate phase | the rollout (it enters the sampling seeds) |
| ``validate`` | bool (False) | validation, ReMax's greedy baseline | ``RolloutMethods.generate_sequences`` (``rollout.val_kwargs`` sampling) |
| ``sampling`` | dict (none) | the service | ``RolloutMethods.generate_sequences`` (this request's sampling keys) |
| ``policy_version`` | int (none) | ``fully_async``'s producer, with partial rollouts | ``RolloutMethods.generate_sequences`` (waits for these weights, reports each token's version) |
| ``old_log_probs_from_update`` | bool (False) | the actor-update phase | ``Actor.forward_backward``, the policy loss |
| ``rollout_correction`` | dict (none) | the actor-update phase, in rollout correction's bypass mode | ``Actor.forward_backward``, the policy loss (it runs the ``bypass_mode`` loss) |
| ``rollout_is_in_loss`` | dict (none) | the actor-update phase, when an on-policy update's loss computes rollout correction's IS weights | ``Actor.forward_backward``, the policy loss |
| ``prompt_top_k`` | int (0) | the service | ``RolloutMethods.score_prompts`` (top-k tokens at each prompt position) |
| ``mini_batch_size`` | int (required) | the critic-update phase | ``Critic.update_critic`` |
| ``seed`` | int (0) | the critic-update phase | ``Critic.update_critic`` (mini-batch shuffle) |
| ``metrics`` | dict ({}) | worker methods | dispatch (reduces them over ranks), the controller |
| ``loss_fn`` | str (required) | the service | ``ModelWorker.forward_backward`` |
| ``loss_fn_config`` | dict ({}) | the service | ``ModelWorker.forward_backward`` |
| ``forward_only`` | bool (False) | the service | ``ModelWorker.forward_backward`` |
| ``custom_loss`` | a ``GraphLoss`` (none) | the service, for a server-side custom loss | ``ModelWorker.forward_backward`` |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, MutableMapping, TypeVar

__all__ = ["MetaKey", "SCHEMA", "TEMPERATURE", "COMPUTE_ENTROPY", "GLOBAL_STEP", "VALIDATE", "SAMPLING",
           "POLICY_VERSION", "OLD_LOG_PROBS_FROM_UPDATE", "ROLLOUT_CORRECTION", "ROLLOUT_IS_IN_LOSS", "PROMPT_TOP_K",
           "MINI_BATCH_SIZE", "SEED", "METRICS",
           "LOSS_FN", "LOSS_FN_CONFIG", "FORWARD_ONLY", "CUSTOM_LOSS"]

T = TypeVar("T")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # the default of a key every reader needs


@dataclass(frozen=True)
class MetaKey(Generic[T]):
    """One ``meta_info`` key: its ``name``, the ``convert`` its readers apply, its ``default`` and meaning."""

    name: str
    convert: Callable[[Any], T]
    default: Any
    doc: str

    def read(self, meta: Mapping[str, Any]) -> T:
        """The value in ``meta`` (else the default), converted; a required key that is missing is a
        ``KeyError`` naming it and the keys ``meta`` has."""
        if self.name in meta:
            return self.convert(meta[self.name])
        if self.default is REQUIRED:
            raise KeyError(f"meta_info needs '{self.name}' ({self.doc}); it has {sorted(meta)}")
        return self.convert(self.default)

    def pop(self, meta: MutableMapping[str, Any]) -> T:
        """``read``, then remove the key from ``meta``."""
        value = self.read(meta)
        meta.pop(self.name, None)
        return value


def _as_is(value: Any) -> Any:
    return value


TEMPERATURE: MetaKey[float] = MetaKey("temperature", float, 1.0, "the rollout's sampling temperature; log-prob forwards divide the logits by it")
COMPUTE_ENTROPY: MetaKey[bool] = MetaKey("compute_entropy", bool, False, "whether an engine forward also returns the per-token entropy")
GLOBAL_STEP: MetaKey[int] = MetaKey("global_step", int, 0, "the training step a generate call belongs to; it enters the sampling seeds")
VALIDATE: MetaKey[bool] = MetaKey("validate", bool, False, "generate with rollout.val_kwargs instead of the training sampling keys")
SAMPLING: MetaKey[Any] = MetaKey("sampling", _as_is, REQUIRED, "one request's sampling keys (SamplingConfig keys plus stop_token_ids)")
POLICY_VERSION: MetaKey[Any] = MetaKey(
    "policy_version", _as_is, None,
    "the oldest weights a generation may sample with (partial rollouts: weights change while it runs, and the output "
    "says which version sampled each token)")
OLD_LOG_PROBS_FROM_UPDATE: MetaKey[bool] = MetaKey(
    "old_log_probs_from_update", bool, False,
    "an on-policy update batch: the old log-probs are the update forward's own, detached (docs/algorithms.md)")
ROLLOUT_CORRECTION: MetaKey[Any] = MetaKey(
    "rollout_correction", _as_is, None,
    "bypass mode's algorithm.rollout_correction settings (a plain dict); set, the policy loss is the bypass_mode loss")
ROLLOUT_IS_IN_LOSS: MetaKey[Any] = MetaKey(
    "rollout_is_in_loss", _as_is, None,
    "an on-policy update's rollout_is and rollout_is_threshold (a plain dict); set, the policy loss weights each token "
    "by the IS weight of its detached log-prob against rollout_log_probs")
PROMPT_TOP_K: MetaKey[int] = MetaKey("prompt_top_k", int, 0, "score_prompts: how many of the most likely tokens to return at each prompt position")
MINI_BATCH_SIZE: MetaKey[int] = MetaKey("mini_batch_size", int, REQUIRED, "the global mini-batch size of a critic update, in sequences")
SEED: MetaKey[int] = MetaKey("seed", int, 0, "the seed of a critic update's mini-batch shuffle")
METRICS: MetaKey[dict] = MetaKey("metrics", dict, {}, "a worker method's metrics, reduced over ranks by its dispatch mode")
LOSS_FN: MetaKey[str] = MetaKey("loss_fn", str, REQUIRED, "the service's Tinker loss name")
LOSS_FN_CONFIG: MetaKey[dict] = MetaKey("loss_fn_config", dict, {}, "the options of the service's Tinker loss")
FORWARD_ONLY: MetaKey[bool] = MetaKey("forward_only", bool, False, "the service's forward pass without gradients")
CUSTOM_LOSS: MetaKey[Any] = MetaKey("custom_loss", _as_is, None,
                                    "the service's server-side custom loss (rlflow.service.custom_loss_graph.GraphLoss)")

SCHEMA: tuple[MetaKey[Any], ...] = (TEMPERATURE, COMPUTE_ENTROPY, GLOBAL_STEP, VALIDATE, SAMPLING, POLICY_VERSION,
                                    OLD_LOG_PROBS_FROM_UPDATE, ROLLOUT_CORRECTION, ROLLOUT_IS_IN_LOSS, PROMPT_TOP_K, MINI_BATCH_SIZE,
                                    SEED, METRICS, LOSS_FN, LOSS_FN_CONFIG, FORWARD_ONLY, CUSTOM_LOSS)
