"""One generation request and its completion: the unit a request-level rollout serves.

A ``GenerationRequest`` is one prompt (token ids) sampled once (``sampling.n`` is 1) with its own
seed; its ``Completion`` carries the sampled token ids exactly as the engine produced them, their
log-probs (when the rollout computes them) and why generation stopped. The batched step generation,
the agent loops and the asynchronous trainer all speak in these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlflow.rollout.sampling import Sampling

FINISH_REASONS = ("stop", "length", "abort")  # stop: an end token or stop string; length: out of budget


@dataclass(frozen=True)
class GenerationRequest:
    """Sample one response to ``prompt_ids``.

    ``seed`` None samples unseeded. ``allowed_token_ids``, when given, restricts sampling to those
    tokens (constrained actions, e.g. an environment's move set).
    """

    prompt_ids: tuple[int, ...]
    sampling: Sampling
    seed: Optional[int] = None
    allowed_token_ids: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if self.sampling.n != 1:
            raise ValueError(f"a GenerationRequest samples once; got sampling.n={self.sampling.n} (send n requests)")
        if not self.prompt_ids:
            raise ValueError("a GenerationRequest needs at least one prompt token")


@dataclass(frozen=True)
class Completion:
    """What one request produced: ``token_ids`` as sampled (not cut at a stop string: the caller cuts),
    ``log_probs`` of those tokens (None when the rollout does not compute them), ``finish_reason``,
    one of ``FINISH_REASONS``, and the policy version that sampled each token (``versions``: set by a
    ``RequestServer``, whose weights may change while a request is in flight)."""

    token_ids: tuple[int, ...]
    log_probs: Optional[tuple[float, ...]]
    finish_reason: str
    versions: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if self.log_probs is not None and len(self.log_probs) != len(self.token_ids):
            raise ValueError(f"{len(self.log_probs)} log-probs for {len(self.token_ids)} tokens")
        if self.versions is not None and len(self.versions) != len(self.token_ids):
            raise ValueError(f"{len(self.versions)} versions for {len(self.token_ids)} tokens")
