"""``single_turn``: one model turn per sample, the default loop; what the batched ``generate`` samples."""

from __future__ import annotations

from rlflow.rollout.agent.loop import AGENT_LOOP_REGISTRY, AgentInput, AgentLoop
from rlflow.rollout.agent.trajectory import Trajectory


@AGENT_LOOP_REGISTRY.register("single_turn")
class SingleTurnLoop(AgentLoop):
    """The prompt, one sampled response, done."""

    async def run(self, sample: AgentInput) -> Trajectory:
        trajectory = Trajectory(list(sample.prompt_ids), self.ctx.sampling.max_new_tokens)
        tokens, completion = await self.ctx.generate(trajectory, sample)
        trajectory.add_model_turn(tokens, completion)
        return trajectory
