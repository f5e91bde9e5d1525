"""Agent loops on the request-level rollout: single-turn, tool use and environments (docs/agents.md).

Importing this package registers the built-in loops (``single_turn``, ``tool_agent``, ``env_agent``) and
tools; ``generate_trajectories`` runs each row's loop over a batch on one replica.
"""

from rlflow.rollout.agent import env_agent, single_turn, tool_agent  # noqa: F401  (register the loops)
from rlflow.rollout.agent.env import ENV_REGISTRY, Env, EnvStep
from rlflow.rollout.agent.loop import AGENT_LOOP_REGISTRY, AgentContext, AgentInput, AgentLoop
from rlflow.rollout.agent.runner import AGENT_NAME_COLUMN, generate_trajectories
from rlflow.rollout.agent.trajectory import Trajectory

__all__ = [
    "AGENT_LOOP_REGISTRY",
    "AGENT_NAME_COLUMN",
    "ENV_REGISTRY",
    "AgentContext",
    "AgentInput",
    "AgentLoop",
    "Env",
    "EnvStep",
    "Trajectory",
    "generate_trajectories",
]
