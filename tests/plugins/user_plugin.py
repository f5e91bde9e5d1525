"""A user's plugin, written as a user would (outside the rlflow package), passed by path in ``trainer.plugins``.

It registers an engine (a subclass of the FSDP2 engine with a config class of its own), a policy
loss and a reward. Each leaves a marker file ``<kind>-<pid>`` whenever it runs, so the tests can
tell which processes ran it: the engine in the directory of its own config key ``marker_dir``,
the rest in the directory named by ``$RLFLOW_PLUGIN_MARKERS`` (unset: no markers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rlflow.algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
from rlflow.engines.config import StepHyperparams
from rlflow.engines.fsdp2 import FSDP2Engine, FSDP2EngineConfig
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.rewards import REWARD_REGISTRY

MARKER_ENV = "RLFLOW_PLUGIN_MARKERS"
REWARD_SOURCE = "user/digit_share"


def leave_marker(directory: Optional[str], kind: str, text: str = "") -> None:
    if directory:
        Path(directory, f"{kind}-{os.getpid()}").write_text(text)


leave_marker(os.environ.get(MARKER_ENV), "import")


@dataclass
class UserFSDP2Config(FSDP2EngineConfig):
    """FSDP2's options plus one of the plugin's own."""

    name: str = "user_fsdp2"
    marker_dir: str = ""  # where each rank leaves its marker on every optimizer step ("": nowhere)


@ENGINE_REGISTRY.register("user_fsdp2")
class UserFSDP2Engine(FSDP2Engine):
    """The FSDP2 engine, marking every optimizer step with this process's rank."""

    config_class = UserFSDP2Config
    config: UserFSDP2Config

    def optim_step(self, lr: Optional[float] = None, hyperparams: Optional[StepHyperparams] = None) -> dict[str, Any]:
        leave_marker(self.config.marker_dir, "engine", str(self.rank))
        return super().optim_step(lr, hyperparams)


@POLICY_LOSS_REGISTRY.register("user_vanilla")
def user_vanilla_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
    """The vanilla PPO loss, marking the process that computed it."""
    leave_marker(os.environ.get(MARKER_ENV), "policy_loss")
    return get_policy_loss_fn("vanilla")(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)


@REWARD_REGISTRY.register(REWARD_SOURCE)
def digit_share(data_source, solution_str, ground_truth, extra_info=None):
    """The share of digit characters in the response (varies between samples, so GRPO has advantages)."""
    leave_marker(os.environ.get(MARKER_ENV), "reward")
    return sum(ch.isdigit() for ch in solution_str) / max(len(solution_str), 1)
