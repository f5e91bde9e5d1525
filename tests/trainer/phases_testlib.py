"""Stand-in roles for driver tests: worker-group methods that record each call, the prompts, a loader.

The config, the algorithms, ``ResponseScorer``, ``DivergenceGuard`` and the rollout's output layout are the
real ones; the worker groups and the reward function are stand-ins (``tests/trainer/test_phases.py``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch

from rlflow.algos import get_kl_controller
from rlflow.meta_info import METRICS, OLD_LOG_PROBS_FROM_UPDATE, VALIDATE
from rlflow.protocol import DataProto
from rlflow.rollout.processing import build_rollout_output
from rlflow.rollout.sampling import Sampling
from rlflow.trainer.divergence import DivergenceGuard
from rlflow.trainer.entry_points import compose_ppo_config
from rlflow.trainer.phases import PhaseContext, RunPlan
from rlflow.trainer.response_scoring import ResponseScorer

PROMPTS, RESPONSE, PAD = 4, 6, 0
ROLLOUT_LOG_PROB, OLD_LOG_PROB = -0.5, -0.45  # the stand-in rollout's and old-log-prob pass's value of every token
BASE = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2", "trainer.n_procs_per_node=2",
        "data.max_response_length=6", "rollout.response_length=6"]


class Method:
    """A worker-group method seen from the controller: records each call, answers with ``answer``."""

    def __init__(self, name: str, calls: list[tuple[str, Any]], answer: Callable[..., Any]):
        self.name, self.calls, self.answer = name, calls, answer

    def __call__(self, *args: Any) -> Any:
        self.calls.append((self.name, args[0] if args else None))
        return self.answer(*args)

    def future(self, *args: Any) -> SimpleNamespace:
        result = self(*args)  # sent now; the controller waits later
        return SimpleNamespace(get=lambda: result)


def columns(data: DataProto, **values: float) -> DataProto:
    shape = data.batch["responses"].shape
    return DataProto.from_dict({key: torch.full(shape, value) for key, value in values.items()})


def generate_fn(config: Any) -> Callable[[DataProto], DataProto]:
    def generate(prompts: DataProto) -> DataProto:
        greedy = VALIDATE.read(prompts.meta_info)
        n = 1 if greedy else config.rollout.n
        tokens = [row[mask.bool()].tolist() for row, mask in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"])]
        responses = [[3 + (i % 5)] * (1 + (i * 7 + int(greedy)) % RESPONSE) for i in range(len(tokens) * n)]
        sampling = Sampling(n, greedy, 1.0, 1.0, -1, RESPONSE, (), None)
        log_probs = [[ROLLOUT_LOG_PROB] * len(r) for r in responses] if config.rollout.calculate_log_probs else None
        out = build_rollout_output(prompts, tokens, responses, log_probs, sampling, PAD)
        out.meta_info[METRICS.name] = {"timing_s/generate": 0.1, "rollout/generated_tokens": float(out.batch["response_mask"].sum())}
        return out
    return generate


def forward_backward(mini: DataProto) -> DataProto:
    out = columns(mini, log_probs=-0.4, entropy=0.7) if OLD_LOG_PROBS_FROM_UPDATE.read(mini.meta_info) else DataProto()
    out.meta_info[METRICS.name] = {"actor/pg_loss": 0.25}
    return out


def stand_in_roles(config: Any, calls: list[tuple[str, Any]]) -> SimpleNamespace:
    actor = SimpleNamespace(
        compute_log_prob=Method("compute_log_prob", calls, lambda d: columns(d, old_log_probs=OLD_LOG_PROB, entropys=0.7)),
        compute_ref_log_prob=Method("compute_ref_log_prob", calls, lambda d: columns(d, ref_log_prob=-0.6)),
        forward_backward=Method("forward_backward", calls, forward_backward),
        optim_step=Method("optim_step", calls, lambda: [{"actor/skipped": 0.0, "actor/grad_norm": 1.5}]),
    )
    critic = SimpleNamespace(
        compute_values=Method("compute_values", calls, lambda d: columns(d, values=0.1)),
        update_critic=Method("update_critic", calls, lambda d: {"critic/vf_loss": 0.3, "critic/optim_steps": 2.0,
                                                                "critic/trailing_skipped_steps": 0.0}),
    )
    roles = SimpleNamespace(
        actor=actor, ref=actor, critic=critic, reward_model=None, rollout_restarted_at=[],
        rollout=SimpleNamespace(generate_sequences=Method("generate_sequences", calls, generate_fn(config))),
        free_rollout_memory=Method("free_rollout_memory", calls, lambda cfg: None),
        sync_weights=Method("sync_weights", calls, lambda cfg, version: {"weight_sync/mb": 1.0}),
    )
    roles.generate = lambda prompts, version: roles.rollout.generate_sequences(prompts)  # PlacedRoles.generate, no restarts
    return roles


def stand_in_reward(batch: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
    """A stand-in reward function: the response length / 10 on each response's last token."""
    mask = batch.batch["response_mask"]
    scores = torch.zeros(mask.shape)
    scores[torch.arange(len(mask)), mask.sum(-1) - 1] = mask.sum(-1) / 10.0
    return scores, {"reward/error_count": 0.0}


def stand_in_context(overrides: list[str], calls: list[tuple[str, Any]]) -> PhaseContext:
    config = compose_ppo_config(BASE + overrides)
    return PhaseContext(config, RunPlan.from_config(config, None), stand_in_roles(config, calls), stand_in_reward,
                        ResponseScorer(stand_in_reward, config.reward), DivergenceGuard.from_config(config),
                        get_kl_controller(config.algorithm.kl_ctrl))


def stand_in_prompts() -> DataProto:
    lengths = [3, 5, 2, 4]
    mask = torch.tensor([[0] * (5 - n) + [1] * n for n in lengths])
    return DataProto.from_dict(
        {"input_ids": torch.arange(1, 21).reshape(4, 5) * mask, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
        {"uid": np.array([f"0-{i}" for i in range(PROMPTS)], dtype=object), "data_source": np.array(["t"] * PROMPTS, dtype=object),
         "ground_truth": np.array(["1"] * PROMPTS, dtype=object)})


class StandInLoader:
    """The stand-in prompts, batch after batch; its state is the number of batches it has given."""

    epoch = 0

    def __init__(self) -> None:
        self.given = 0

    def __iter__(self):
        while True:
            self.given += 1
            yield stand_in_prompts()

    def state_dict(self) -> dict[str, int]:
        return {"given": self.given}
