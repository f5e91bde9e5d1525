"""Every config value that must be one of a set, checked in one pass before anything is built.

OmegaConf cannot express "one of these strings" for values such as ``token-mean`` (it rejects
``Literal`` and matches an ``Enum`` by member name), so each entry point keeps a table of
``config key -> where its legal values live``: a ``Registry`` (plugins may add names, so the
table is read after they are imported) or the table of names the code that consumes the value
already keeps. ``check_choices`` walks the table over a validated config and raises the one
``UserError`` line of the first bad value, naming its key, in the registries' one format
(``unknown <kind> '<value>' (config key <key>); registered: ...``) whichever kind of table holds
the names; entry points run it in config loading, before Ray starts or any model is built.
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
from rlflow.config.multi_turn_schema import TRUNCATE_SIDES
from rlflow.config.schema import RECOMPUTE_MODES, RESUME_MODES
from rlflow.data.rl_dataset import RL_TRUNCATION_POLICIES
from rlflow.data.sft_dataset import SFT_TRUNCATION_POLICIES
from rlflow.engines.common.optim.lr_schedulers import LR_SCHEDULE_REGISTRY
from rlflow.engines.config import ADAMW_IMPLEMENTATIONS, LORA_PARTS
from rlflow.models.hf_checkpoint import DTYPES
from rlflow.models.presets import PRESETS
from rlflow.observability.tracking import TRACKER_REGISTRY
from rlflow.rewards.combine import REWARD_COMBINE_REGISTRY
from rlflow.rollout import LORA_SYNC_MODES, ROLLOUT_REGISTRY
from rlflow.rollout.agent import AGENT_LOOP_REGISTRY, ENV_REGISTRY
from rlflow.rollout.agent.tools import TOOL_CALL_PARSER_REGISTRY, TOOL_REGISTRY
from rlflow.rollout.processing import PROMPT_OVERFLOW_POLICIES
from rlflow.rollout.sampling import LOGPROBS_MODES
from rlflow.utils.device import DEVICES
from rlflow.utils.registry import Registry, unknown_name_message

# A registry (plugins may add names, so it is read when the check runs) or a table of names.
NameSource = Union[Registry, Collection[str]]


@dataclass(frozen=True)
class Choice:
    """One config key whose value (or each item of its list value) must be a name of ``names``.

    ``kind`` says what a table's names are, for the message (a registry names its own kind and
    exception). ``base_name`` maps a value to the name looked up (``k3+`` -> ``k3``). A key absent
    from the config, or null, is not checked (null means "off" wherever a choice is optional).
    """

    key: str
    names: NameSource
    kind: str = ""
    base_name: Callable[[str], str] = str

    def __post_init__(self) -> None:
        if isinstance(self.names, Registry) == bool(self.kind):
            raise TypeError(f"Choice {self.key!r}: give a kind for a table of names, and none for a registry")

    def check(self, cfg: DictConfig) -> None:
        """Raise the one-line ``UserError`` naming ``key`` when a value is not a legal name."""
        value = OmegaConf.select(cfg, self.key, default=None)
        values = list(value) if isinstance(value, (ListConfig, list, tuple)) else [] if value is None else [value]
        for item in values:
            if self.base_name(str(item)) in self.names:
                continue
            if isinstance(self.names, Registry):
                raise self.names.error(self.names.unknown_message(str(item), self.key))
            raise ConfigError(unknown_name_message(self.kind, str(item), self.names, self.key))


def _kl_base(name: str) -> str:
    return name.removesuffix(STRAIGHT_THROUGH_SUFFIX)


def engine_choices(mount: str) -> list[Choice]:
    """The choice keys every engine has (``EngineConfig``), under the engine mounted at ``mount``."""
    return [
        Choice(f"{mount}.device", DEVICES, "device"),
        *(Choice(f"{mount}.{key}", DTYPES, "dtype") for key in ("dtype", "param_dtype", "reduce_dtype")),
        Choice(f"{mount}.lr_scheduler.name", LR_SCHEDULE_REGISTRY),
        Choice(f"{mount}.optimizer.implementation", ADAMW_IMPLEMENTATIONS, "AdamW implementation"),
        Choice(f"{mount}.lora.parts", LORA_PARTS, "LoRA part"),
    ]


def run_choices() -> list[Choice]:
    """The choice keys of ``RunConfig`` and ``ModelConfig``, shared by every entry point."""
    return [
        Choice("model.preset", PRESETS, "model preset"),
        Choice("trainer.device", DEVICES, "device"),
        Choice("trainer.logger", TRACKER_REGISTRY),
        Choice("trainer.resume_mode", RESUME_MODES, "resume mode"),
    ]


def rollout_choices() -> list[Choice]:
    """The choice keys of the ``rollout`` node (``main_ppo``, the Tinker service)."""
    return [
        Choice("rollout.name", ROLLOUT_REGISTRY),
        Choice("rollout.logprobs_mode", LOGPROBS_MODES, "logprobs mode"),
        Choice("rollout.prompt_overflow", PROMPT_OVERFLOW_POLICIES, "prompt overflow policy"),
        Choice("rollout.dtype", DTYPES, "dtype"),
        Choice("rollout.lora_sync", LORA_SYNC_MODES, "LoRA sync mode"),
        Choice("rollout.multi_turn.default_agent_loop", AGENT_LOOP_REGISTRY),
        Choice("rollout.multi_turn.format", TOOL_CALL_PARSER_REGISTRY),
        Choice("rollout.multi_turn.tools", TOOL_REGISTRY),
        Choice("rollout.multi_turn.tool_response_truncate_side", TRUNCATE_SIDES, "truncation side"),
        Choice("rollout.multi_turn.env_class", ENV_REGISTRY),
    ]


def ppo_algorithm_choices() -> list[Choice]:
    """The choice keys of the RL algorithm: ``data``, ``actor``, ``critic``, ``algorithm``, ``reward``."""
    return [
        Choice("data.truncation", RL_TRUNCATION_POLICIES, "truncation policy"),
        Choice("actor.loss_agg_mode", LOSS_AGG_REGISTRY),
        Choice("critic.loss_agg_mode", LOSS_AGG_REGISTRY),
        Choice("actor.kl_loss_type", KL_ESTIMATOR_REGISTRY, base_name=_kl_base),
        Choice("actor.policy_loss.loss_mode", POLICY_LOSS_REGISTRY),
        Choice("actor.recompute_old_log_probs", RECOMPUTE_MODES, "recompute mode"),
        Choice("algorithm.adv_estimator", ADV_ESTIMATOR_REGISTRY),
        Choice("algorithm.kl_penalty", KL_ESTIMATOR_REGISTRY, base_name=_kl_base),
        Choice("algorithm.kl_ctrl.type", KL_CONTROLLER_REGISTRY),
        Choice("reward.combine", REWARD_COMBINE_REGISTRY),
    ]


def sft_data_choices() -> list[Choice]:
    """The choice keys of the SFT ``data`` node."""
    return [Choice("data.truncation", SFT_TRUNCATION_POLICIES, "truncation policy")]


def mounted_engine_choices(engine_mounts: Iterable[str]) -> list[Choice]:
    """``engine_choices`` of every mount."""
    return [choice for mount in engine_mounts for choice in engine_choices(mount)]


def check_choices(cfg: DictConfig, choices: Iterable[Choice]) -> None:
    """Check every ``Choice`` against ``cfg``; the first bad value raises its one-line ``UserError``."""
    for choice in choices:
        choice.check(cfg)

