"""What an asynchronous training mode needs of the rest of the config, settled before Ray (docs/async.md).

* Split placement: generation overlaps training only when the rollout replicas are processes of their
  own (``trainer.placement=split``); a colocated process does one thing at a time.
* ``fully_async``'s keys: a staleness bound of at least 0 versions, weights published at least every
  ``staleness_threshold + 1`` updates (else the samples of the next step wait for weights that never
  come), ``require_batches`` dividing the step's batch; partial rollouts in ``fully_async`` only, with the
  whole model synced (not ``rollout.lora_sync=adapter``); ``restart_rollout`` in an asynchronous mode only.
* Rollout correction: the samples of an asynchronous mode come from an older policy than the one
  trained, so with ``async_training.rollout_correction`` (the default) and no correction configured,
  token-level truncated importance sampling is turned on at ``algorithm.rollout_correction``'s
  default threshold, with the rollout's log-probs it reads. Switching it off is allowed, and warned about.
"""

from __future__ import annotations

from omegaconf import DictConfig, open_dict

from rlflow.config import ConfigError
from rlflow.rollout import syncs_adapters
from rlflow.utils.logging import get_logger

__all__ = ["settle_async_training"]

logger = get_logger(__name__)

SYNC = "sync"
FULLY_ASYNC = "fully_async"
DEFAULT_IS_LEVEL = "token"


def check_async_keys(config: DictConfig) -> None:
    """Refuse ``async_training`` keys that do not fit together (each key's own range is declared in its schema)."""
    section = config.async_training
    staleness, trigger, chunks = section.staleness_threshold, section.trigger_parameter_sync_step, section.require_batches
    if trigger > staleness + 1:
        raise ConfigError(f"config key 'async_training.trigger_parameter_sync_step': must be 1..staleness_threshold + 1 "
                          f"({staleness + 1}), got {trigger}: a step's samples would wait for weights never published")
    if config.data.train_batch_size % chunks:
        raise ConfigError(f"config key 'async_training.require_batches': must divide data.train_batch_size "
                          f"({config.data.train_batch_size}), got {chunks}")
    if section.partial_rollout and section.mode != FULLY_ASYNC:
        raise ConfigError(f"config key 'async_training.partial_rollout': partial rollouts are part of "
                          f"async_training.mode={FULLY_ASYNC}, not {section.mode}")
    if section.restart_rollout and section.mode == SYNC:
        raise ConfigError("config key 'async_training.restart_rollout': restarts a dead rollout pool of an asynchronous "
                          "mode; set async_training.mode=one_step_off or fully_async (a sync run ends with the worker named)")
    if section.partial_rollout and syncs_adapters(config.rollout):
        raise ConfigError("config key 'async_training.partial_rollout': a live weight sync loads the whole model; "
                          "rollout.lora_sync=adapter is not supported with it (set rollout.lora_sync=merged)")


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
