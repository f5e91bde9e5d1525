"""Per-step metrics of the PPO driver, under verl's names (``critic/score/mean``, ``response_length/mean`` ...)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlflow.algos import compute_rollout_correction_and_rejection_mask, masked_mean
from rlflow.observability.val_metrics import PRED, named_validation_metrics, source_metrics
from rlflow.protocol import DataProto
from rlflow.rewards.scoring import ScoreResult
from rlflow.rollout import rollout_mismatch_metrics


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()), f"{prefix}/min": float(values.min())}


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    return _stats(prefix, values[mask.bool()])


def data_metrics(batch: DataProto, use_critic: bool) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values, lengths and entropy of one training batch.

    Lengths count the generated tokens (the response part of ``attention_mask``), so rollout correction's
    rejection, which zeroes ``response_mask``, does not shorten them. ``actor/entropy`` comes from the
    old-log-prob pass's ``entropys``; a step without them (bypass mode) reports the update forward's.
    """
    data = batch.batch
    mask = data["response_mask"]
    response_length = data["attention_mask"][:, -mask.shape[1]:].sum(-1).float()
    prompt_length = data["attention_mask"].sum(-1).float() - response_length
    metrics = {
        **_stats("critic/score", data["token_level_scores"].sum(-1)),
        **_stats("critic/rewards", data["token_level_rewards"].sum(-1)),
        **_masked_stats("critic/advantages", data["advantages"], mask),
        **_masked_stats("critic/returns", data["returns"], mask),
        **_stats("response_length", response_length),
        **_stats("prompt_length", prompt_length),
        "response_length/clip_ratio": float((response_length == mask.shape[1]).float().mean()),
    }
    if "entropys" in data:
        metrics["actor/entropy"] = float(masked_mean(data["entropys"], mask))
    if use_critic:
        metrics.update(_masked_stats("critic/values", data["values"], mask))
    if "ref_log_prob" in data:
        metrics["actor/ref_kl"] = float(masked_mean(data["old_log_probs"] - data["ref_log_prob"], mask))
    return metrics


def throughput_metrics(batch: DataProto, timings: dict[str, float], world_size: int) -> dict[str, float]:
    """Tokens processed per second of step time, per worker process, and generated tokens per second."""
    total_tokens = float(batch.batch["attention_mask"].sum())
    width = batch.batch["response_mask"].shape[1]
    generated = float(batch.batch["attention_mask"][:, -width:].sum())  # rejection does not undo generation
    step_s = max(timings.get("step", 0.0), 1e-9)
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/throughput": total_tokens / step_s / world_size,
        "perf/gen_tokens_per_s": generated / max(timings.get("gen", 0.0), 1e-9),
    }


def rollout_log_prob_metrics(batch: DataProto) -> dict[str, float]:
    """The train/inference mismatch (``rollout/logprob_diff_*``) and verl's off-policy metrics
    (``rollout_corr/*``: kl, k3_kl, perplexities, chi2) of a batch with ``rollout_log_probs``; ``{}`` without."""
    data = batch.batch
    if "rollout_log_probs" not in data:
        return {}
    rollout, old, mask = data["rollout_log_probs"], data["old_log_probs"], data["response_mask"]
    return {**rollout_mismatch_metrics(rollout, old, mask), **compute_rollout_correction_and_rejection_mask(old, rollout, mask)[2]}


def step_end_metrics(batch: DataProto, timings: dict[str, float], use_critic: bool, world_size: int,
                     step: int, with_rollout_log_prob_metrics: bool = True) -> dict[str, float]:
    """What a PPO step reports after its phases: ``rollout_log_prob_metrics`` (unless a rollout-correction
    phase or the bypass loss reported them: ``with_rollout_log_prob_metrics`` false), the batch's data metrics,
    ``timing_s/<phase>``, throughput and ``training/global_step``."""
    return {
        **(rollout_log_prob_metrics(batch) if with_rollout_log_prob_metrics else {}),
        **data_metrics(batch, use_critic=use_critic),
        **{f"timing_s/{name}": seconds for name, seconds in timings.items()},
        **throughput_metrics(batch, timings, world_size),
        "training/global_step": step,
    }

def validation_metrics(batch: DataProto, results: Sequence[ScoreResult]) -> dict[str, float]:
    """verl's ``val-core/<data_source>/reward/mean@N`` family (``rlflow.observability.val_metrics``) for a
    scored validation batch, plus ``val-aux/response_length/mean``.

    ``results`` are the batch's per-sample reward results: their score is the ``reward`` variable,
    each extra number that every sample reported (a failed sample reports none) one more variable,
    their ``pred`` the answer majority votes count.
    """
    infos: dict[str, list[Any]] = {"reward": batch.batch["token_level_scores"].sum(-1).tolist()}
    for key in sorted(set.intersection(*(set(result.extras) for result in results)) if results else ()):
        infos[key] = [result.extras[key] for result in results]
    if any(result.pred is not None for result in results):
        infos[PRED] = [result.pred for result in results]
    by_source = source_metrics(batch.non_tensor_batch["data_source"].tolist(), batch.non_tensor_batch["uid"].tolist(), infos)
    metrics = named_validation_metrics(by_source)
    metrics["val-aux/response_length/mean"] = float(batch.batch["response_mask"].sum(-1).float().mean())
    return metrics
