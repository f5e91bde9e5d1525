"""What an asynchronous training mode needs of the rest of the config, settled before Ray (docs/async.md).

* Split placement: generation overlaps training only when the rollout replicas are processes of their
  own (``trainer.placement=split``); a colocated process does one thing at a time.
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


def settle_async_training(config: DictConfig) -> None:
    """Refuse an asynchronous mode without split placement; turn its rollout correction on (in place)."""
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
