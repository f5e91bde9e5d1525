"""The start-up check of ``algorithm.rollout_correction`` (before Ray): one ``ConfigError`` line naming the key."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from rlflow.algos.policy_losses import get_policy_loss_fn
from rlflow.algos.rollout_correction.bypass_loss import BYPASS_LOSS_MODE, BYPASS_LOSS_TYPE_REGISTRY
from rlflow.algos.rollout_correction.rejection import rejection_rule
from rlflow.algos.rollout_correction.settings import correction_settings, needs_rollout_log_probs
from rlflow.algos.rollout_correction.thresholds import parse_is_threshold, parse_rejection_thresholds, split_options
from rlflow.algos.rollout_correction.weights import ROLLOUT_IS_LEVEL_REGISTRY
from rlflow.config.validation import ConfigError

SECTION = "algorithm.rollout_correction"


def _key_error(key: str, check: Callable[[], Any]) -> Any:
    """``check()``; a ValueError from it becomes one ConfigError line naming ``key`` (a registry's unknown-name
    ConfigError, which names the key already, passes as it is)."""
    try:
        return check()
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"config key '{SECTION}.{key}': {str(error).splitlines()[0]}") from None


def _takes_weights(loss_mode: str) -> bool:
    parameters = inspect.signature(get_policy_loss_fn(loss_mode)).parameters
    return "rollout_is_weights" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def check_rollout_correction(config: Any) -> None:
    """Check the PPO config's ``algorithm.rollout_correction`` against itself and the keys it depends on.

    Refused: an unknown IS level, RS option or bypass loss type; a malformed threshold (a non-positive
    number, a ``lower_upper`` whose lower bound is not below its upper one, lower/upper bounds on a
    k2/k3 option, a count of thresholds that is neither 1 nor the number of options); rejection
    without a threshold; weighting, rejection or bypass without ``rollout.calculate_log_probs``;
    ``loss_type`` reinforce outside bypass mode; ``actor.policy_loss.loss_mode=bypass_mode`` set by hand,
    or bypass mode with a loss mode other than ``vanilla`` (bypass replaces the loss); weights with a
    policy loss that takes none.
    """
    settings = correction_settings(config.algorithm.rollout_correction)
    if settings.rollout_is is not None:
        ROLLOUT_IS_LEVEL_REGISTRY.get(settings.rollout_is)
        _key_error("rollout_is_threshold", lambda: parse_is_threshold(settings.rollout_is_threshold))
    if settings.rollout_rs is not None:
        options = _key_error("rollout_rs", lambda: split_options(settings.rollout_rs))
        two_sided = {option: rejection_rule(option).two_sided for option in options}
        _key_error("rollout_rs_threshold", lambda: parse_rejection_thresholds(two_sided, settings.rollout_rs_threshold))
    BYPASS_LOSS_TYPE_REGISTRY.get(settings.loss_type)
    if needs_rollout_log_probs(settings) and not config.rollout.calculate_log_probs:
        raise ConfigError(f"config key 'rollout.calculate_log_probs': {SECTION} (rollout_is, rollout_rs or bypass_mode) "
                          "reads the rollout's log-probs; set rollout.calculate_log_probs=true")
    if settings.loss_type != "ppo_clip" and not settings.bypass_mode:
        raise ConfigError(f"config key '{SECTION}.loss_type': {settings.loss_type} applies in bypass mode only; "
                          f"set {SECTION}.bypass_mode=true or loss_type=ppo_clip")
    loss_mode = config.actor.policy_loss.loss_mode
    if loss_mode == BYPASS_LOSS_MODE:
        raise ConfigError(f"config key 'actor.policy_loss.loss_mode': {BYPASS_LOSS_MODE} is chosen by {SECTION}.bypass_mode"
                          f"=true (with {SECTION}.loss_type); set loss_mode=vanilla")
    if settings.bypass_mode and loss_mode != "vanilla":
        raise ConfigError(f"config key '{SECTION}.bypass_mode': bypass mode replaces the policy loss by its loss_type "
                          f"(ppo_clip | reinforce); actor.policy_loss.loss_mode={loss_mode} would be ignored, set it to vanilla")
    if settings.rollout_is is not None and not settings.bypass_mode and not _takes_weights(loss_mode):
        raise ConfigError(f"config key '{SECTION}.rollout_is': the policy loss {loss_mode!r} takes no rollout_is_weights "
                          "keyword; add one (docs/algorithms.md, 'Adding your own') or set rollout_is=null")
