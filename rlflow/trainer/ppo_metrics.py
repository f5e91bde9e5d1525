"""Per-step metrics of the PPO driver, under verl's names (``critic/score/mean``, ``response_length/mean`` ...)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from rlflow.algos import masked_mean
from rlflow.protocol import DataProto


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()), f"{prefix}/min": float(values.min())}


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    return _stats(prefix, values[mask.bool()])


def data_metrics(batch: DataProto, use_critic: bool) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values, lengths and entropy of one training batch."""
    data = batch.batch
    mask = data["response_mask"]
    response_length = mask.sum(-1).float()
    prompt_length = data["attention_mask"].sum(-1).float() - response_length
    metrics = {
        **_stats("critic/score", data["token_level_scores"].sum(-1)),
        **_stats("critic/rewards", data["token_level_rewards"].sum(-1)),
        **_masked_stats("critic/advantages", data["advantages"], mask),
        **_masked_stats("critic/returns", data["returns"], mask),
        **_stats("response_length", response_length),
        **_stats("prompt_length", prompt_length),
        "response_length/clip_ratio": float((response_length == mask.shape[1]).float().mean()),
        "actor/entropy": float(masked_mean(data["entropys"], mask)),
    }
    if use_critic:
        metrics.update(_masked_stats("critic/values", data["values"], mask))
    if "ref_log_prob" in data:
        metrics["actor/ref_kl"] = float(masked_mean(data["old_log_probs"] - data["ref_log_prob"], mask))
    return metrics


def throughput_metrics(batch: DataProto, timings: dict[str, float], world_size: int) -> dict[str, float]:
    """Tokens processed per second of step time, per worker process, and generated tokens per second."""
    total_tokens = float(batch.batch["attention_mask"].sum())
    generated = float(batch.batch["response_mask"].sum())
    step_s = max(timings.get("step", 0.0), 1e-9)
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/throughput": total_tokens / step_s / world_size,
        "perf/gen_tokens_per_s": generated / max(timings.get("gen", 0.0), 1e-9),
    }


def validation_metrics(batch: DataProto) -> dict[str, float]:
    """``val/score/mean`` over all prompts, ``val/<data_source>/score/mean`` per source, response length."""
    scores = batch.batch["token_level_scores"].sum(-1).tolist()
    by_source: dict[str, list[float]] = defaultdict(list)
    for source, score in zip(batch.non_tensor_batch["data_source"].tolist(), scores):
        by_source[source].append(score)
    metrics = {f"val/{source}/score/mean": float(np.mean(values)) for source, values in by_source.items()}
    metrics["val/score/mean"] = float(np.mean(scores))
    metrics["val/response_length/mean"] = float(batch.batch["response_mask"].sum(-1).float().mean())
    return metrics
