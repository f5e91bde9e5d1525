"""``env/*``: the reward an environment gave a trajectory (``rlflow.rollout.agent``'s ``env_agent`` loop).

The loop writes the sum of the environment's step rewards into each sample's ``extra_info`` under
``agent_reward``; rows whose ``data_source`` starts with ``env/`` are scored with it, so environment
tasks need no reward function of their own.
"""

from __future__ import annotations

from typing import Any

from rlflow.rewards.registry import REWARD_REGISTRY

AGENT_REWARD_KEY = "agent_reward"


@REWARD_REGISTRY.register("env/*")
def environment_reward(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """``extra_info['agent_reward']``; a row without one was not produced by an environment loop."""
    reward = (extra_info or {}).get(AGENT_REWARD_KEY)
    if reward is None:
        raise ValueError(f"data_source {data_source!r} is scored by its environment, but the sample has no "
                         f"extra_info.{AGENT_REWARD_KEY}; run it with rollout.multi_turn.enable=true and the "
                         "env_agent loop")
    return float(reward)
