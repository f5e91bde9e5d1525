"""Generate phases: the step's samples, their balance over the DP ranks, and ReMax's greedy baseline."""

from __future__ import annotations

from typing import Protocol

import torch

from rlflow.meta_info import GLOBAL_STEP, METRICS, TEMPERATURE, VALIDATE
from rlflow.protocol import DataProto, DataProtoFuture
from rlflow.rollout.agent.runner import VERSIONS_COLUMN
from rlflow.trainer.batch_balance import balance_batch
from rlflow.trainer.phases.base import BatchKeys, Phase, RolePass
from rlflow.trainer.phases.columns import ROLLOUT_COLUMNS, ROLLOUT_LOG_PROBS
from rlflow.trainer.phases.context import PhaseContext, StepState

__all__ = ["Balance", "Generate", "GreedyBaselines", "PendingSamples", "SentGenerate", "staleness_metrics", "token_version_metrics"]


def staleness_metrics(trainer_version: int, sample_versions: list[int]) -> dict[str, float]:
    """``async/*``: the oldest sampling version among a step's samples and how many versions the samples are
    behind the trainer (each sample counts its oldest token)."""
    behind = [trainer_version - version for version in sample_versions]
    return {"async/policy_version": min(sample_versions), "async/staleness/mean": sum(behind) / len(behind),
            "async/staleness/max": max(behind)}


def token_version_metrics(trainer_version: int, versions: torch.Tensor) -> dict[str, float]:
    """``staleness_metrics`` of a ``rollout_versions`` column (each sample counts its oldest token), and
    ``async/partial_samples``: the share of samples whose tokens came from more than one version (resumed after
    a weight sync)."""
    sampled = versions >= 0
    rows = sampled.any(dim=-1)
    oldest = torch.where(sampled, versions, torch.iinfo(versions.dtype).max).min(dim=-1).values[rows]
    newest = torch.where(sampled, versions, -1).max(dim=-1).values[rows]
    return {**staleness_metrics(trainer_version, oldest.tolist()),
            "async/partial_samples": float((newest > oldest).float().mean())}


class Generate(RolePass):
    """``rollout.n`` samples per prompt from the rollout replicas, with the rollout's metrics.

    Its input is the step's prompts (``input_ids``/``attention_mask``/``position_ids`` and the
    loader's non-tensor columns); its output is the step's batch, whose ``meta_info`` carries
    ``TEMPERATURE`` (the log-prob passes use the sampling temperature) and ``GLOBAL_STEP``. With
    ``rollout.calculate_log_probs`` it also holds ``rollout_log_probs``. ``start`` sends the request
    without waiting (the one-step-off loop sends the next step's while this one trains). A rollout whose weights
    changed during the generation (partial rollouts) says which version sampled each token (``rollout_versions``):
    its metrics then include how stale the samples are (``token_version_metrics``).
    """

    name = "generate"
    reads = ("input_ids", "attention_mask", "position_ids")

    def keys(self, ctx: PhaseContext, state: StepState) -> BatchKeys:
        log_probs = (ROLLOUT_LOG_PROBS,) if ctx.config.rollout.calculate_log_probs else ()
        return BatchKeys(self.reads, ROLLOUT_COLUMNS + log_probs)

    def start(self, ctx: PhaseContext, prompts: DataProto, state: StepState) -> DataProtoFuture:
        request = prompts.select()
        request.meta_info[GLOBAL_STEP.name] = state.step  # the sampling seeds: the same whenever it is sent
        return ctx.roles.rollout.generate_sequences.future(request)

    def run(self, ctx: PhaseContext, prompts: DataProto, state: StepState) -> DataProto:
        return self.finish(ctx, self.start(ctx, prompts, state).get(), state)

    @staticmethod
    def finish(ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        """The rollout's output as the step's batch: its metrics, the sampling temperature and the step in ``meta_info``."""
        metrics = METRICS.pop(batch.meta_info)
        if VERSIONS_COLUMN in batch.batch:
            metrics.update(token_version_metrics(state.policy_version, batch.batch[VERSIONS_COLUMN]))
        batch.meta_info = {TEMPERATURE.name: ctx.config.rollout.temperature, GLOBAL_STEP.name: state.step,
                           METRICS.name: metrics}
        return batch


class PendingSamples(Protocol):
    """Samples sent earlier (a ``DataProtoFuture``; ``fully_async``'s ``StepSamples``): ``get`` waits for them."""

    def get(self) -> DataProto:
        ...


class SentGenerate(Phase):
    """A ``Generate`` sent earlier (``Generate.start``); running it waits for the samples."""

    name = Generate.name

    def __init__(self, sent: PendingSamples):
        self.sent = sent

    def keys(self, ctx: PhaseContext, state: StepState) -> BatchKeys:
        return Generate().keys(ctx, state)

    def run(self, ctx: PhaseContext, prompts: DataProto, state: StepState) -> DataProto:
        return Generate.finish(ctx, self.sent.get(), state)


class Balance(Phase):
    """The batch's rows reordered so each DP rank's chunk carries a near-equal amount of work (``balance_batch``)."""

    name = "balance"
    reads = ("attention_mask",)

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        return balance_batch(batch, ctx.plan.world_size, ctx.plan.share_prefix)


class GreedyBaselines(Phase):
    """ReMax's baseline: the rule reward of each prompt's greedy response (``rollout.val_kwargs``
    sampling), as ``reward_baselines`` ``[B]`` for the batch rows, matched by ``uid``."""

    name = "greedy_baselines"
    reads = ("uid",)
    writes = ("reward_baselines",)

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        prompts = state.prompts.select()
        prompts.meta_info.update({GLOBAL_STEP.name: state.step, VALIDATE.name: True})
        greedy = ctx.roles.generate(prompts, state.policy_version)
        METRICS.pop(greedy.meta_info)
        scores, _ = ctx.reward_manager(greedy)
        by_uid = dict(zip(greedy.non_tensor_batch["uid"].tolist(), scores.sum(-1).tolist()))
        baselines = [by_uid[uid] for uid in batch.non_tensor_batch["uid"].tolist()]
        return DataProto.from_dict({"reward_baselines": torch.tensor(baselines, dtype=torch.float32)})
