"""Run each row's agent loop over a batch of prompts on one replica, and lay the trajectories out as the batch.

Every sample of every row (``n`` per row) is one coroutine; all of them run concurrently on the
replica's ``RequestServer``, so their model turns share engine steps while tools run. The output has
the batched ``generate``'s layout (``responses``, ``response_mask``, ``rollout_log_probs`` ...), with
``response_mask`` 0 on tool and environment tokens, plus the non-tensor column ``num_turns``; served by a
given ``RequestServer`` (asynchronous training), also ``rollout_versions``: the policy version that sampled
each response token, -1 on the others. When a loop
scored its trajectories (an environment's reward), each sample's ``extra_info`` carries it as
``agent_reward``, which the ``env/*`` reward returns.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Optional

import numpy as np
import torch

from rlflow.protocol import DataProto
from rlflow.rewards.environment import AGENT_REWARD_KEY
from rlflow.rollout.agent.loop import AGENT_LOOP_REGISTRY, AgentContext, AgentInput
from rlflow.rollout.agent.trajectory import Trajectory
from rlflow.rollout.agent.turns import TurnEncoder
from rlflow.rollout.base import BaseRollout
from rlflow.rollout.processing import ResponseEnd, build_rollout_output
from rlflow.rollout.request_server import RequestServer

AGENT_NAME_COLUMN = "agent_name"  # verl's column
VERSIONS_COLUMN = "rollout_versions"  # [B, R]: the policy version that sampled each response token, -1 elsewhere


def _row(prompts: DataProto, index: int) -> dict[str, Any]:
    return {key: values[index] for key, values in prompts.non_tensor_batch.items()}


def _column(output: DataProto, key: str) -> list[Any]:
    values = output.non_tensor_batch.get(key)
    return [None] * len(output) if values is None else list(values)


def agent_names(prompts: DataProto, default: str) -> list[str]:
    """Each row's loop: its ``agent_name`` column, or ``default`` where the column is missing or empty."""
    column = prompts.non_tensor_batch.get(AGENT_NAME_COLUMN)
    return [str(column[i]) if column is not None and column[i] else default for i in range(len(prompts))]


def generate_trajectories(
    rollout: BaseRollout, prompts: DataProto, multi_turn: Any, sampling: Any = None,
    server: Optional[RequestServer] = None,
) -> tuple[DataProto, dict[str, float]]:
    """``n`` trajectories per prompt row (a row's adjacent), each from the loop its row names; and the mean of
    every per-trajectory metric (``num_turns``, ``agent/*``). ``server``: serve them there and report each
    token's version (module doc)."""
    params, tokens, seed_key = rollout.prepare(prompts, sampling)
    names = agent_names(prompts, multi_turn.default_agent_loop)
    versioned = server is not None
    server = server or RequestServer(rollout)
    ctx = AgentContext(
        server=server,
        tokenizer=rollout.tokenizer,
        sampling=replace(params, n=1),
        end=ResponseEnd(rollout.end_token_ids(params), params.stop, rollout.tokenizer),
        seed_key=seed_key,
        multi_turn=multi_turn,
        turns=TurnEncoder(rollout.tokenizer, rollout.eos_ids),
    )
    loops = {name: AGENT_LOOP_REGISTRY.get(name)(ctx) for name in sorted(set(names))}
    samples = [AgentInput(tuple(tokens[row]), _row(prompts, row), (row, k))
               for row in range(len(tokens)) for k in range(params.n)]

    async def run_all() -> list[Trajectory]:
        return list(await asyncio.gather(*(loops[names[s.index[0]]].run(s) for s in samples)))

    trajectories = server.serve(run_all()) if samples else []
    log_probs = [t.log_probs for t in trajectories] if rollout.calculate_log_probs else None
    output = build_rollout_output(prompts, tokens, [t.response_ids for t in trajectories], log_probs, params,
                                  rollout.pad_token_id, response_masks=[t.response_mask for t in trajectories])
    output.non_tensor_batch["num_turns"] = np.array([t.turns + t.env_turns for t in trajectories], dtype=np.int64)
    if versioned:
        width = output.batch["responses"].shape[1]
        output.batch[VERSIONS_COLUMN] = torch.tensor([t.versions[:width] + [-1] * (width - len(t.versions[:width]))
                                                      for t in trajectories], dtype=torch.long).reshape(-1, width)
    if any(t.reward is not None for t in trajectories):
        output.non_tensor_batch["extra_info"] = np.array(
            [{**dict(extra or {}), AGENT_REWARD_KEY: t.reward}
             for extra, t in zip(_column(output, "extra_info"), trajectories)],
            dtype=object,
        )
    per_trajectory = [t.metrics() for t in trajectories]
    keys = per_trajectory[0] if per_trajectory else {}
    metrics = {key: float(np.mean([m[key] for m in per_trajectory])) for key in keys}
    return output, metrics
