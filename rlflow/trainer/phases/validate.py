"""Validation: generate for the val files with ``rollout.val_kwargs`` and score with the rule rewards."""

from __future__ import annotations

import time
from typing import Iterable

from rlflow.meta_info import GLOBAL_STEP, METRICS, VALIDATE
from rlflow.protocol import DataProto
from rlflow.trainer.phases.context import PhaseContext
from rlflow.trainer.ppo_metrics import validation_metrics

__all__ = ["validate"]


def validate(ctx: PhaseContext, loader: Iterable[DataProto], version: int) -> dict[str, float]:
    """verl's ``val-core/<data_source>/...`` metrics over every batch of ``loader``, and ``timing_s/validate``
    (``version``: the actor's policy version, which a rollout pool started again after dying loads)."""
    start = time.perf_counter()
    outputs, results = [], []
    for prompts in loader:
        prompts.meta_info.update({VALIDATE.name: True, GLOBAL_STEP.name: 0})
        generated = ctx.roles.generate(prompts, version)
        METRICS.pop(generated.meta_info)
        generated.batch["token_level_scores"], _, batch_results = ctx.reward_manager.score_with_results(generated)
        outputs.append(generated)
        results.extend(batch_results)
    metrics = validation_metrics(DataProto.concat(outputs), results)
    metrics["timing_s/validate"] = time.perf_counter() - start
    return metrics
