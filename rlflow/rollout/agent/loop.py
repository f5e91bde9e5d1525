"""``AgentLoop``: how one trajectory is produced, chosen per data row, and the registry of loops.

A data row names its loop in its ``agent_name`` column (verl's column; rows without one take
``rollout.multi_turn.default_agent_loop``). A loop is a class whose ``run`` coroutine produces one
``Trajectory`` from one sample's prompt, awaiting ``ctx.generate`` for each model turn; the runner
runs every trajectory of a replica's share concurrently on one engine. Users add a loop with
``@AGENT_LOOP_REGISTRY.register("name")`` on a subclass in a ``trainer.plugins`` file, which every
rollout worker imports, so the loop runs inside the rollout workers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Optional

from rlflow.config.validation import ConfigError
from rlflow.rollout.agent.trajectory import Trajectory
from rlflow.rollout.agent.turns import TurnEncoder
from rlflow.rollout.processing import ResponseEnd
from rlflow.rollout.request_server import RequestServer
from rlflow.rollout.requests import Completion, GenerationRequest
from rlflow.rollout.sampling import Sampling, request_seed
from rlflow.utils.registry import Registry

SeedKey = Optional[tuple[int, ...]]


@dataclass(frozen=True)
class AgentInput:
    """One sample to produce: the prompt's token ids, the data row's other columns (``raw_prompt``,
    ``extra_info``, ``ground_truth``, ``data_source`` ...) and its position (row, sample) in the batch."""

    prompt_ids: tuple[int, ...]
    row: dict[str, Any]
    index: tuple[int, int]


@dataclass
class AgentContext:
    """What every loop of one generation call shares: the engine, the tokenizer, the sampling and the config."""

    server: RequestServer
    tokenizer: Any
    sampling: Sampling  # one sample per request; max_new_tokens is the whole response budget
    end: ResponseEnd
    seed_key: SeedKey
    multi_turn: Any  # MultiTurnConfig
    turns: TurnEncoder

    async def generate(self, trajectory: Trajectory, sample: AgentInput, **extra: Any) -> tuple[list[int], Completion]:
        """Sample the next model turn of ``trajectory`` within its remaining budget; returns the tokens cut at
        their end (EOS or stop string) and the raw completion. The first turn's seed is the batched path's
        (so ``single_turn`` samples what ``generate`` samples); later turns mix in the turn number."""
        parts = sample.index if trajectory.turns == 0 else sample.index + (trajectory.turns,)
        seed = None if self.seed_key is None else request_seed(*self.seed_key, *parts)
        sampling = replace(self.sampling, max_new_tokens=max(1, trajectory.room))
        completion = await self.server.generate(GenerationRequest(tuple(trajectory.ids), sampling, seed, **extra))
        tokens = list(completion.token_ids)
        return tokens[: self.end.length(tokens)], completion


class AgentLoop(ABC):
    """Produces trajectories; one instance serves every sample of a generation call that names it."""

    name: str = ""

    def __init__(self, ctx: AgentContext):
        self.ctx = ctx

    @abstractmethod
    async def run(self, sample: AgentInput) -> Trajectory:
        """The whole trajectory of ``sample``: ``Trajectory(list(sample.prompt_ids), ctx.sampling.max_new_tokens)``
        grown with ``add_model_turn`` / ``add_env_turn``."""


AGENT_LOOP_REGISTRY: Registry[type[AgentLoop]] = Registry(
    "agent loop", "agent_name / rollout.multi_turn.default_agent_loop", error=ConfigError, base=AgentLoop,
    name_attribute="name",
)
