"""``algorithm.rollout_correction`` read from whatever holds it: the typed config node, a dataclass, a
namespace, or the plain dict that travels to the actor in bypass mode."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Optional

from rlflow.config.schema import RolloutCorrectionConfig

DECOUPLED = "decoupled"  # weights or rejection of the old log-probs against the rollout's, once per batch
BYPASS = "bypass"  # the rollout's log-probs are the old ones; the loss corrects per micro-batch


def correction_settings(source: Any) -> RolloutCorrectionConfig:
    """The seven settings of ``source`` (missing fields take verl's defaults; None is a value, not a gap)."""
    if isinstance(source, RolloutCorrectionConfig):
        return source
    defaults = RolloutCorrectionConfig()
    values = {}
    for field in fields(RolloutCorrectionConfig):
        default = getattr(defaults, field.name)
        values[field.name] = source.get(field.name, default) if isinstance(source, Mapping) else getattr(source, field.name, default)
    return RolloutCorrectionConfig(**values)


def corrects(settings: RolloutCorrectionConfig) -> bool:
    """Whether the settings weight (``rollout_is``) or reject (``rollout_rs``) anything."""
    return settings.rollout_is is not None or settings.rollout_rs is not None


def needs_rollout_log_probs(settings: RolloutCorrectionConfig) -> bool:
    """Whether the settings read the rollout's log-probs: any weighting, rejection, or bypass mode."""
    return corrects(settings) or bool(settings.bypass_mode)


def weights_only_per_sample(settings: RolloutCorrectionConfig) -> bool:
    """Whether the settings only weight (``rollout_is``), each weight from its own sample's tokens: no rejection,
    no batch normalization. Such weights can be computed per micro-batch, inside the update's forward."""
    return settings.rollout_is is not None and settings.rollout_rs is None and not settings.rollout_is_batch_normalize


def correction_mode(settings: RolloutCorrectionConfig) -> Optional[str]:
    """How a PPO step runs the correction: ``BYPASS`` (bypass mode), ``DECOUPLED`` (weights or rejection
    against the old log-probs), or None (nothing to correct: at most the off-policy metrics are reported)."""
    if settings.bypass_mode:
        return BYPASS
    return DECOUPLED if corrects(settings) else None
