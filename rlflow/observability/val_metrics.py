"""Validation metrics under verl's names: ``val-core/<data_source>/<var>/<metric>`` and ``val-aux/...``.

Each validation sample contributes one value per variable: ``reward`` (its score), every extra
number its reward function returned in a dict (``acc``, ...), and, when the function returned a
string ``pred`` (the extracted answer), that answer for majority voting. Per prompt (the samples
sharing a ``uid``, ``rollout.val_kwargs.n`` of them) and variable:

- ``mean@N``, ``std@N`` (population std) over the prompt's N samples;
- for each k in 2, 4, 8, ... below N, and N itself (only when N > 1): ``best@k/mean``,
  ``best@k/std``, ``worst@k/mean``, ``worst@k/std``: the mean and std, over ``BOOTSTRAP_DRAWS``
  bootstrap draws of k samples with replacement, of the draw's max (min) value;
- ``maj@k/mean``, ``maj@k/std`` when answers were reported: the same over the value of the draw's
  majority answer (ties go to the answer seen first in the draw; its first sample's value counts).

The draws come from ``numpy.random.RandomState(BOOTSTRAP_SEED)``, reseeded for every prompt, so
a run's numbers reproduce exactly (and equal verl's, which draws the same way). Each metric is
then averaged over the prompts of a data_source. The metrics of the core variable (``acc`` when a
reward function reports it, else ``reward``) named ``mean@N``, ``best@N/...`` or ``maj@N/...``
at the largest N are ``val-core``; everything else is ``val-aux``.
"""

from __future__ import annotations

import functools

from collections import defaultdict
from typing import Any, Optional, Sequence

import numpy as np

BOOTSTRAP_SEED = 42
BOOTSTRAP_DRAWS = 1000
PRED = "pred"  # the per-sample answer variable; voted on, never averaged
CORE_SECTION, AUX_SECTION = "val-core", "val-aux"


def subset_sizes(n: int) -> list[int]:
    """The bootstrap subset sizes for N samples: 2, 4, 8, ... below N, then N (none for N <= 1)."""
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n] if n > 1 else []


@functools.lru_cache(maxsize=64)
def bootstrap_draws(n: int, k: int, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """``[BOOTSTRAP_DRAWS, k]`` sample indices drawn with replacement from ``range(n)`` (the same for every
    prompt with ``n`` samples, so drawn once; read-only)."""
    draws = np.random.RandomState(seed).choice(n, size=(BOOTSTRAP_DRAWS, k), replace=True)
    draws.flags.writeable = False
    return draws


def majority_value(values: Sequence[float], answers: Sequence[Optional[str]]) -> float:
    """The value of the first sample whose answer is the most frequent one (ties: the answer seen first)."""
    counts: dict[Optional[str], int] = {}
    first_value: dict[Optional[str], float] = {}
    for value, answer in zip(values, answers):
        counts[answer] = counts.get(answer, 0) + 1
        first_value.setdefault(answer, value)
    return first_value[max(counts, key=counts.__getitem__)]


def _stats(results: np.ndarray) -> tuple[float, float]:
    return float(results.mean()), float(results.std())


def prompt_metrics(values: Sequence[float], answers: Optional[Sequence[Optional[str]]], seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """Every metric of one variable over one prompt's samples (see the module docstring)."""
    array = np.asarray(values, dtype=np.float64)
    n = len(array)
    metrics = {f"mean@{n}": float(array.mean())}
    if n < 2:
        return metrics
    metrics[f"std@{n}"] = float(array.std())
    for k in subset_sizes(n):
        draws = bootstrap_draws(n, k, seed)
        drawn = array[draws]  # [draws, k]
        metrics[f"best@{k}/mean"], metrics[f"best@{k}/std"] = _stats(drawn.max(axis=1))
        metrics[f"worst@{k}/mean"], metrics[f"worst@{k}/std"] = _stats(drawn.min(axis=1))
        if answers is not None:
            votes = [majority_value(array[draw], [answers[i] for i in draw]) for draw in draws]
            metrics[f"maj@{k}/mean"], metrics[f"maj@{k}/std"] = _stats(np.asarray(votes, dtype=np.float64))
    return metrics


def source_metrics(
    data_sources: Sequence[str], uids: Sequence[str], infos: dict[str, Sequence[Any]], seed: int = BOOTSTRAP_SEED
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {variable: {metric: mean over the source's prompts}}}`` for per-sample ``infos``.

    ``infos`` maps a variable to one value per sample; ``infos["pred"]`` (optional) holds answers.
    A prompt whose answers are all None gets no ``maj`` metrics.
    """
    groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for index, (source, uid) in enumerate(zip(data_sources, uids)):
        groups[source][uid].append(index)
    answers = infos.get(PRED)
    collected: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for source, prompts in groups.items():
        for indices in prompts.values():
            prompt_answers = None if answers is None else [answers[i] for i in indices]
            if prompt_answers is not None and all(answer is None for answer in prompt_answers):
                prompt_answers = None
            for variable, values in infos.items():
                if variable == PRED:
                    continue
                for metric, value in prompt_metrics([values[i] for i in indices], prompt_answers, seed).items():
                    collected[source][variable][metric].append(value)
    return {source: {variable: {metric: float(np.mean(per_prompt)) for metric, per_prompt in metrics.items()}
                     for variable, metrics in variables.items()} for source, variables in collected.items()}


def _metric_n(metric: str) -> int:
    """The sample count a metric name is taken at: 4 for ``best@4/mean``."""
    return int(metric.split("@")[1].split("/")[0])


def named_validation_metrics(by_source: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """Flat ``val-core/...`` and ``val-aux/...`` names for ``source_metrics``' result."""
    flat = {}
    for source, variables in by_source.items():
        core_variable = "acc" if "acc" in variables else "reward"
        for variable, metrics in variables.items():
            n = max(_metric_n(metric) for metric in metrics)
            for metric, value in metrics.items():
                is_core = variable == core_variable and metric.split("@")[0] in ("mean", "best", "maj") and _metric_n(metric) == n
                flat[f"{CORE_SECTION if is_core else AUX_SECTION}/{source}/{variable}/{metric}"] = value
    return flat
