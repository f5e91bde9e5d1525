"""A user's agent loop and environment, in a plugin file outside the package (``trainer.plugins``).

Each leaves a ``<kind>-<pid>`` marker in ``$RLFLOW_PLUGIN_MARKERS`` whenever it runs, so a test can tell
which processes ran it: ``agent_loop`` for the loop, ``env`` for the environment.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlflow.rollout.agent import AGENT_LOOP_REGISTRY, ENV_REGISTRY, AgentLoop, Env, EnvStep, Trajectory

MARKER_ENV = "RLFLOW_PLUGIN_MARKERS"


def leave_marker(kind: str) -> None:
    directory = os.environ.get(MARKER_ENV)
    if directory:
        Path(directory, f"{kind}-{os.getpid()}").write_text("")


@AGENT_LOOP_REGISTRY.register("user_retry")
class RetryLoop(AgentLoop):
    """Two model turns with a fixed user nudge between them."""

    async def run(self, sample):
        leave_marker("agent_loop")
        trajectory = Trajectory(list(sample.prompt_ids), self.ctx.sampling.max_new_tokens)
        tokens, completion = await self.ctx.generate(trajectory, sample)
        trajectory.add_model_turn(tokens, completion)
        if completion.finish_reason == "stop" and trajectory.add_env_turn(
                self.ctx.turns.encode([{"role": "user", "content": "Check it."}])):
            tokens, completion = await self.ctx.generate(trajectory, sample)
            trajectory.add_model_turn(tokens, completion)
        return trajectory


@ENV_REGISTRY.register("user_digits")
class DigitsEnv(Env):
    """Rewards the share of digits in each turn; two turns."""

    def step(self, action: str) -> EnvStep:
        leave_marker("env")
        self.turn = getattr(self, "turn", 0) + 1
        share = sum(ch.isdigit() for ch in action) / max(len(action), 1)
        return EnvStep([{"role": "user", "content": "More digits."}], reward=share, done=self.turn >= 2)
