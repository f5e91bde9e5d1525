"""Prompt scoring: every prompt token's log-prob under the rollout's weights, and the most likely tokens at each position.

What Tinker's ``compute_logprobs`` and ``sample(include_prompt_logprobs=True, topk_prompt_logprobs=k)`` ask
of a sampler. Scores are the model's own distribution, ``log_softmax(logits)``: no temperature, top-k or top-p,
so they equal the training forward's log-probs. Position ``i`` of a prompt of ``P`` tokens is scored given
tokens ``0..i-1``; position 0 has no score.

``BaseRollout.score_prompts`` returns one ``PromptScores`` per prompt; ``scores_batch`` lays them out as
columns of the left-padded prompt batch the rollout worker received, so they travel through mesh dispatch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlflow.protocol import DataProto

__all__ = ["PromptScores", "scores_from_logits", "scores_batch", "PROMPT_LOG_PROBS", "PROMPT_TOPK_IDS",
           "PROMPT_TOPK_LOG_PROBS"]

PROMPT_LOG_PROBS = "prompt_log_probs"  # [b, W] float: NaN at padding and at each prompt's first token
PROMPT_TOPK_IDS = "prompt_topk_ids"  # [b, W, k] int64 (only when k > 0): most likely first
PROMPT_TOPK_LOG_PROBS = "prompt_topk_log_probs"  # [b, W, k] float


@dataclass(frozen=True)
class PromptScores:
    """A prompt of ``P`` tokens scored: ``log_probs[i]`` is token ``i + 1``'s log-prob given the tokens before it
    (``P - 1`` entries); ``top_ids[i]`` / ``top_log_probs[i]`` the ``k`` most likely tokens there, most likely
    first (empty tuples when no top-k was asked for)."""

    log_probs: tuple[float, ...]
    top_ids: tuple[tuple[int, ...], ...] = ()
    top_log_probs: tuple[tuple[float, ...], ...] = ()


def scores_from_logits(prompt_ids: list[int] | tuple[int, ...], logits: torch.Tensor, top_k: int) -> PromptScores:
    """``PromptScores`` of one prompt from its forward's logits ``[P, V]`` (row ``i`` predicts token ``i + 1``)."""
    log_probs = logits[:-1].float().log_softmax(dim=-1)
    targets = torch.as_tensor(prompt_ids[1:], dtype=torch.long, device=log_probs.device)
    scored = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if top_k <= 0:
        return PromptScores(tuple(scored.tolist()))
    values, ids = log_probs.topk(top_k, dim=-1)
    return PromptScores(tuple(scored.tolist()), tuple(map(tuple, ids.tolist())), tuple(map(tuple, values.tolist())))


def scores_batch(attention_mask: torch.Tensor, scores: list[PromptScores], top_k: int) -> DataProto:
    """``scores`` as columns aligned with a left-padded prompt batch (``attention_mask`` ``[b, W]``): column ``j``
    of row ``r`` scores that row's token at column ``j``."""
    rows, width = attention_mask.shape
    log_probs = torch.full((rows, width), math.nan, dtype=torch.float32)
    columns = {PROMPT_LOG_PROBS: log_probs}
    if top_k > 0:
        columns[PROMPT_TOPK_IDS] = torch.zeros((rows, width, top_k), dtype=torch.long)
        columns[PROMPT_TOPK_LOG_PROBS] = torch.full((rows, width, top_k), math.nan, dtype=torch.float32)
    for row, score in enumerate(scores):
        start = width - int(attention_mask[row].sum()) + 1  # the first scored column: the prompt's second token
        log_probs[row, start:] = torch.tensor(score.log_probs, dtype=torch.float32)
        if top_k > 0 and score.log_probs:
            columns[PROMPT_TOPK_IDS][row, start:] = torch.tensor(score.top_ids, dtype=torch.long)
            columns[PROMPT_TOPK_LOG_PROBS][row, start:] = torch.tensor(score.top_log_probs, dtype=torch.float32)
    return DataProto.from_dict(columns)
