"""``env_agent``: model turns alternate with an ``Env``'s observations until the episode ends.

The trajectory's reward is the sum of the environment's step rewards; turns are bounded by
``rollout.multi_turn.max_assistant_turns`` and the response budget.
"""

from __future__ import annotations

from rlflow.rollout.agent.env import ENV_REGISTRY
from rlflow.rollout.agent.loop import AGENT_LOOP_REGISTRY, AgentInput, AgentLoop
from rlflow.rollout.agent.trajectory import Trajectory


@AGENT_LOOP_REGISTRY.register("env_agent")
class EnvAgentLoop(AgentLoop):
    """Drives the row's environment (``extra_info.env_class`` or ``rollout.multi_turn.env_class``)."""

    async def run(self, sample: AgentInput) -> Trajectory:
        ctx, config = self.ctx, self.ctx.multi_turn
        extra = sample.row.get("extra_info") or {}
        env = ENV_REGISTRY.get(extra.get("env_class") or config.env_class)(sample.row)
        trajectory = Trajectory(list(sample.prompt_ids), ctx.sampling.max_new_tokens)
        trajectory.reward = 0.0
        opening = env.init(list(sample.row.get("raw_prompt") or []))
        if opening and not trajectory.add_env_turn(ctx.turns.encode(opening)):
            return trajectory
        while trajectory.room > 0:
            tokens, completion = await ctx.generate(trajectory, sample)
            trajectory.add_model_turn(tokens, completion)
            result = env.step(ctx.tokenizer.decode(tokens, skip_special_tokens=True))
            trajectory.reward += float(result.reward)
            ended = result.done or completion.finish_reason != "stop"
            if ended or (config.max_assistant_turns and trajectory.turns >= config.max_assistant_turns):
                break
            if not trajectory.add_env_turn(ctx.turns.encode(result.observation)):
                break
        return trajectory
