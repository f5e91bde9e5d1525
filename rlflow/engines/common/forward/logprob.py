"""Per-token log-probs and entropy from hidden states, a chunk of tokens at a time.

The LM head is applied to ``chunk_size`` hidden states at once and the float32 logits
of that chunk are reduced to one log-prob (and entropy) per token before the next
chunk, so the full ``[tokens, vocab]`` float32 tensor never exists. With gradients on,
each chunk is activation-checkpointed: backward recomputes its logits instead of
keeping them, so training memory is bounded the same way.

The reduction of a chunk's logits to log-probs is ``log_probs_from_logits`` unless the caller
gives another with the same signature: a tensor-parallel engine whose head yields a
vocabulary shard of the logits reduces across its tensor-parallel group instead.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["LogProbsFromLogits", "chunked_log_probs", "log_probs_from_logits"]

# (float32 logits [n, vocab or a vocabulary shard], labels [n], compute_entropy) -> (log_probs [n], entropy [n] or None)
LogProbsFromLogits = Callable[[torch.Tensor, torch.Tensor, bool], "tuple[torch.Tensor, Optional[torch.Tensor]]"]


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, compute_entropy: bool
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """log p(label) and (optionally) the entropy per row of float32 ``logits`` ``[n, vocab]``."""
    log_norm = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_norm
    if not compute_entropy:
        return log_probs, None
    probs = torch.softmax(logits, dim=-1)
    entropy = log_norm - (probs * logits).sum(-1)
    return log_probs, entropy


def _chunk(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    compute_entropy: bool,
    reduce: LogProbsFromLogits,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs, entropy = reduce(logits, labels, compute_entropy)
    return log_probs, entropy if entropy is not None else log_probs.new_zeros(())


def chunked_log_probs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = False,
    reduce: LogProbsFromLogits = log_probs_from_logits,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs ``[n]`` of ``labels`` under ``head(hidden) / temperature``, plus entropy ``[n]`` if asked.

    ``hidden`` is ``[n, hidden_size]``; ``head`` maps it to logits (the LM head); ``reduce`` turns a
    chunk's logits into log-probs and entropy (module docstring).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    use_checkpoint = torch.is_grad_enabled() and hidden.requires_grad
    log_prob_parts, entropy_parts = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        args = (head, hidden[start : start + chunk_size], labels[start : start + chunk_size], temperature, compute_entropy,
                reduce)
        if use_checkpoint:
            log_probs, entropy = checkpoint(_chunk, *args, use_reentrant=False)
        else:
            log_probs, entropy = _chunk(*args)
        log_prob_parts.append(log_probs)
        entropy_parts.append(entropy)
    if not log_prob_parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if compute_entropy else None)
    log_probs = torch.cat(log_prob_parts)
    return log_probs, (torch.cat(entropy_parts) if compute_entropy else None)
