"""What an asynchronous training mode needs of the rest of the config, settled before Ray (docs/async.md).

* Split placement: generation overlaps training only when the rollout replicas are processes of their
  own (``trainer.placement=split``); a colocated process does one thing at a time.
* ``fully_async``'s keys: a staleness bound of at least 0 versions, weights published at least every
  ``staleness_threshold + 1`` updates (else the samples of the next step wait for weights that never
  come), ``require_batches`` dividing the step's batch; partial rollouts are not built yet.
* Rollout correction: the samples of an asynchronous mode come from an older policy than the one
  trained, so with ``async_training.rollout_correction`` (the default) and no correction configured,
  token-level truncated importance sampling is turned on at ``algorithm.rollout_correction``'s
  default threshold, with the rollout's log-probs it reads. Switching it off is allowed, and warned about.
"""

from __future__ import annotations

from omegaconf import DictConfig, open_dict

from rlflow.config import ConfigError
from rlflow.utils.logging import get_logger

__all__ = ["settle_async_training"]

logger = get_logger(__name__)

SYNC = "sync"
DEFAULT_IS_LEVEL = "token"


def check_async_keys(config: DictConfig) -> None:
    """Refuse ``async_training`` keys out of range, whichever mode runs."""
    section = config.async_training
    staleness, trigger, chunks = section.staleness_threshold, section.trigger_parameter_sync_step, section.require_batches
    if staleness < 0:
        raise ConfigError(f"config key 'async_training.staleness_threshold': must be >= 0 (actor updates), got {staleness}")
    if not 1 <= trigger <= staleness + 1:
        raise ConfigError(f"config key 'async_training.trigger_parameter_sync_step': must be 1..staleness_threshold + 1 "
                          f"({staleness + 1}), got {trigger}: a step's samples would wait for weights never published")
    if chunks < 1 or config.data.train_batch_size % chunks:
        raise ConfigError(f"config key 'async_training.require_batches': must divide data.train_batch_size "
                          f"({config.data.train_batch_size}), got {chunks}")
    if section.partial_rollout:
        raise ConfigError("config key 'async_training.partial_rollout': partial rollouts (abort and resume at a weight "
                          "sync) are not built yet; set it to false")


def settle_async_training(config: DictConfig) -> None:
    """Refuse bad ``async_training`` keys, or an asynchronous mode without split placement; turn its rollout
    correction on (in place)."""
    check_async_keys(config)
    mode = config.async_training.mode
    if mode == SYNC:
        return
    if config.trainer.placement != "split":
        raise ConfigError(f"config key 'async_training.mode': {mode} generates while the trainer trains, which needs the "
                          f"rollout replicas in a pool of their own; set trainer.placement=split (colocated runs sync)")
    correction = config.algorithm.rollout_correction
    if not config.async_training.rollout_correction:
        logger.warning("async_training.rollout_correction=false: %s trains on samples from an older policy and nothing "
                       "corrects for it", mode)
        return
    if correction.rollout_is is None and correction.rollout_rs is None and not correction.bypass_mode:
        with open_dict(config):
            correction.rollout_is = DEFAULT_IS_LEVEL
            config.rollout.calculate_log_probs = True
        logger.info("async_training.mode=%s: rollout correction on (algorithm.rollout_correction.rollout_is=%s, "
                    "threshold %s; async_training.rollout_correction=false turns it off)", mode, DEFAULT_IS_LEVEL,
                    correction.rollout_is_threshold)
