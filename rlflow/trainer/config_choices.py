"""Every config value that must be one of a set, checked in one pass before anything is built.

OmegaConf cannot express "one of these strings" for values such as ``token-mean`` (it rejects
``Literal`` and matches an ``Enum`` by member name), so each entry point keeps a table of
``config key -> where its legal values live``: a ``Registry`` (plugins may add names, so the
table is read after they are imported) or the table of names the code that consumes the value
already keeps. ``check_choices`` walks the table over a validated config and raises the one
``UserError`` line of the first bad value, naming its key; entry points run it in config
loading, before Ray starts or any model is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Union

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlflow.algos import (
    ADV_ESTIMATOR_REGISTRY,
    KL_CONTROLLER_REGISTRY,
    KL_ESTIMATOR_REGISTRY,
    LOSS_AGG_REGISTRY,
    POLICY_LOSS_REGISTRY,
)
from rlflow.algos.kl import STRAIGHT_THROUGH_SUFFIX
from rlflow.config import ConfigError
from rlflow.data.rl_dataset import RL_TRUNCATION_POLICIES
from rlflow.data.sft_dataset import SFT_TRUNCATION_POLICIES
from rlflow.engines.common.optim.lr_schedulers import LR_SCHEDULE_REGISTRY
from rlflow.engines.config import ADAMW_IMPLEMENTATIONS, LORA_PARTS
from rlflow.models.hf_checkpoint import DTYPES
from rlflow.models.presets import PRESETS
from rlflow.observability.tracking import TRACKER_REGISTRY
from rlflow.rewards.combine import REWARD_COMBINE_REGISTRY
from rlflow.rollout import LORA_SYNC_MODES, ROLLOUT_REGISTRY
from rlflow.rollout.processing import PROMPT_OVERFLOW_POLICIES
from rlflow.rollout.sampling import LOGPROBS_MODES
from rlflow.trainer.checkpoint import RESUME_MODES
from rlflow.trainer.old_log_probs import RECOMPUTE_MODES
from rlflow.trainer.placement import PLACEMENTS
from rlflow.utils.device import DEVICES
from rlflow.utils.registry import Registry

# A registry, a collection of names, or a function returning one (for tables that live in a
# module that imports config loading itself, read when the check runs).
NameSource = Union[Registry, Collection[str], Callable[[], Collection[str]]]


@dataclass(frozen=True)
class Choice:
    """One config key whose value (or each item of its list value) must be a name of ``names``.

    ``base_name`` maps a value to the name looked up (``k3+`` -> ``k3``). A key absent from the
    config, or null, is not checked (null means "off" wherever a choice is optional).
    """

    key: str
    names: NameSource
    base_name: Callable[[str], str] = str

    def check(self, cfg: DictConfig) -> None:
        """Raise the one-line ``UserError`` naming ``key`` when a value is not a legal name."""
        value = OmegaConf.select(cfg, self.key, default=None)
        values = list(value) if isinstance(value, (ListConfig, list, tuple)) else [] if value is None else [value]
        for item in values:
            name = self.base_name(str(item))
            if isinstance(self.names, Registry):
                if name not in self.names:
                    raise self.names.error(self.names.unknown_message(str(item), self.key))
                continue
            legal = self.names() if callable(self.names) else self.names
            if name not in legal:
                raise ConfigError(f"config key '{self.key}': unknown value {item!r}; choose one of {', '.join(sorted(legal))}")


def _kl_base(name: str) -> str:
    return name.removesuffix(STRAIGHT_THROUGH_SUFFIX)


def _sft_launchers() -> Collection[str]:
    from rlflow.trainer.main_sft import LAUNCHERS  # main_sft imports config loading: read its table lazily

    return LAUNCHERS


def engine_choices(mount: str) -> list[Choice]:
    """The choice keys every engine has (``EngineConfig``), under the engine mounted at ``mount``."""
    return [
        Choice(f"{mount}.device", DEVICES),
        *(Choice(f"{mount}.{key}", DTYPES) for key in ("dtype", "param_dtype", "reduce_dtype")),
        Choice(f"{mount}.lr_scheduler.name", LR_SCHEDULE_REGISTRY),
        Choice(f"{mount}.optimizer.implementation", ADAMW_IMPLEMENTATIONS),
        Choice(f"{mount}.lora.parts", LORA_PARTS),
    ]


def run_choices() -> list[Choice]:
    """The choice keys of ``RunConfig`` and ``ModelConfig``, shared by every entry point."""
    return [
        Choice("model.preset", PRESETS),
        Choice("trainer.device", DEVICES),
        Choice("trainer.logger", TRACKER_REGISTRY),
        Choice("trainer.resume_mode", RESUME_MODES),
    ]


def rollout_choices() -> list[Choice]:
    """The choice keys of the ``rollout`` node (``main_ppo``, the Tinker service)."""
    return [
        Choice("rollout.name", ROLLOUT_REGISTRY),
        Choice("rollout.logprobs_mode", LOGPROBS_MODES),
        Choice("rollout.prompt_overflow", PROMPT_OVERFLOW_POLICIES),
        Choice("rollout.dtype", DTYPES),
        Choice("rollout.lora_sync", LORA_SYNC_MODES),
    ]


def ppo_choices(engine_mounts: Iterable[str]) -> list[Choice]:
    """Every choice key of ``main_ppo``'s config."""
    return [
        *run_choices(),
        Choice("trainer.placement", PLACEMENTS),
        Choice("data.truncation", RL_TRUNCATION_POLICIES),
        Choice("actor.loss_agg_mode", LOSS_AGG_REGISTRY),
        Choice("critic.loss_agg_mode", LOSS_AGG_REGISTRY),
        Choice("actor.kl_loss_type", KL_ESTIMATOR_REGISTRY, _kl_base),
        Choice("actor.policy_loss.loss_mode", POLICY_LOSS_REGISTRY),
        Choice("actor.recompute_old_log_probs", RECOMPUTE_MODES),
        *rollout_choices(),
        Choice("algorithm.adv_estimator", ADV_ESTIMATOR_REGISTRY),
        Choice("algorithm.kl_penalty", KL_ESTIMATOR_REGISTRY, _kl_base),
        Choice("algorithm.kl_ctrl.type", KL_CONTROLLER_REGISTRY),
        Choice("reward.combine", REWARD_COMBINE_REGISTRY),
        *(choice for mount in engine_mounts for choice in engine_choices(mount)),
    ]


def sft_choices(engine_mounts: Iterable[str]) -> list[Choice]:
    """Every choice key of ``main_sft``'s config."""
    return [
        *run_choices(),
        Choice("trainer.launcher", _sft_launchers),
        Choice("data.truncation", SFT_TRUNCATION_POLICIES),
        *(choice for mount in engine_mounts for choice in engine_choices(mount)),
    ]


def check_choices(cfg: DictConfig, choices: Iterable[Choice]) -> None:
    """Check every ``Choice`` against ``cfg``; the first bad value raises its one-line ``UserError``."""
    for choice in choices:
        choice.check(cfg)

