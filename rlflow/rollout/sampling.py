"""Sampling parameters as both rollout backends read them, and the per-request seed derivation.

The config has two sources of sampling: the flat training keys of ``RolloutConfig`` (``n``,
``temperature`` ...) and ``rollout.val_kwargs`` (a ``SamplingConfig``). ``resolve_sampling``
turns either, or any object with those attribute names, into one frozen ``Sampling``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from rlflow.config.validation import ConfigError

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
_GREEDY_TEMPERATURE = 1e-5  # vLLM treats temperatures below this as greedy; so do we


@dataclass(frozen=True)
class Sampling:
    """Concrete sampling parameters for one ``generate`` call."""

    n: int
    greedy: bool
    temperature: float
    top_p: float
    top_k: int  # -1: off
    max_new_tokens: int
    stop: tuple[str, ...]
    seed: Optional[int]  # None: unseeded
    stop_token_ids: tuple[int, ...] = ()  # tokens that end a response, besides the model's EOS tokens


def _get(source: Any, key: str, default: Any) -> Any:
    if isinstance(source, dict):
        return source.get(key, default)
    return getattr(source, key, default)


def resolve_sampling(source: Any, default_max_new_tokens: int) -> Sampling:
    """A ``Sampling`` from a ``SamplingConfig``, a ``RolloutConfig`` or a dict with the same keys.

    ``do_sample: false`` or a temperature of (almost) 0 means greedy. ``max_new_tokens`` missing
    or null falls back to ``default_max_new_tokens`` (the rollout's ``response_length``).
    """
    max_new_tokens = _get(source, "max_new_tokens", None) or default_max_new_tokens
    temperature = float(_get(source, "temperature", 1.0))
    greedy = not bool(_get(source, "do_sample", True)) or temperature < _GREEDY_TEMPERATURE
    sampling = Sampling(
        n=int(_get(source, "n", 1)),
        greedy=greedy,
        temperature=1.0 if greedy else temperature,
        top_p=float(_get(source, "top_p", 1.0)),
        top_k=int(_get(source, "top_k", -1)),
        max_new_tokens=int(max_new_tokens),
        stop=tuple(_get(source, "stop", ()) or ()),
        seed=_get(source, "seed", None),
        stop_token_ids=tuple(int(token) for token in _get(source, "stop_token_ids", ()) or ()),
    )
    _check(sampling)
    return sampling


def _check(s: Sampling) -> None:
    if s.n < 1:
        raise ConfigError(f"sampling n must be >= 1, got {s.n}")
    if s.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens (rollout.response_length) must be >= 1, got {s.max_new_tokens}")
    if not 0.0 < s.top_p <= 1.0:
        raise ConfigError(f"sampling top_p must be in (0, 1], got {s.top_p}")
    if s.top_k == 0 or s.top_k < -1:
        raise ConfigError(f"sampling top_k must be -1 (off) or >= 1, got {s.top_k}")
    if s.temperature <= 0:
        raise ConfigError(f"sampling temperature must be > 0 when sampling, got {s.temperature}")
    if any(not isinstance(text, str) or not text for text in s.stop):
        raise ConfigError(f"stop strings must be non-empty strings, got {list(s.stop)}")


def check_rollout_sampling(config: Any) -> None:
    """Resolve the training (``rollout``) and validation (``rollout.val_kwargs``) sampling of a validated config, as
    the rollout workers will, so what they would refuse is one ``ConfigError`` naming the node before Ray starts."""
    rollout = config.rollout
    for key, source in (("rollout", rollout), ("rollout.val_kwargs", rollout.val_kwargs)):
        try:
            resolve_sampling(source, rollout.response_length)
        except ConfigError as error:
            raise ConfigError(f"config key '{key}': {error}") from None


def check_logprobs_mode(mode: str) -> str:
    """``mode`` if it is a supported ``rollout.logprobs_mode``; else a ConfigError listing them."""
    if mode not in LOGPROBS_MODES:
        raise ConfigError(f"rollout.logprobs_mode must be one of {LOGPROBS_MODES}, got {mode!r}")
    return mode


def request_seed(base_seed: int, *parts: int) -> int:
    """A 31-bit seed mixed from ``base_seed`` and integer ``parts`` (step, replica, row, sample).

    Distinct parts give statistically independent seeds; the same parts always give the same seed.
    """
    entropy = [int(base_seed) & 0xFFFFFFFF] + [int(p) & 0xFFFFFFFF for p in parts]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint32)[0] >> 1)
