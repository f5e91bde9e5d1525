"""verl-style validation metrics: the bootstrap math against exact expectations and a plain-Python
re-computation, the majority vote, and the val-core / val-aux naming."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from rlflow.observability.val_metrics import (
    BOOTSTRAP_DRAWS,
    bootstrap_draws,
    majority_value,
    named_validation_metrics,
    prompt_metrics,
    source_metrics,
    subset_sizes,
)


def exact_expectation(values: list[float], k: int, reduce) -> float:
    """E[reduce(k draws with replacement)], by enumerating every one of the n**k draws."""
    draws = list(itertools.product(range(len(values)), repeat=k))
    return sum(reduce([values[i] for i in draw]) for draw in draws) / len(draws)


def plain_majority(values: list[float], answers: list[str]) -> float:
    """Most frequent answer (ties: the one appearing first); the value of its first sample."""
    counts = Counter(answers)
    top = max(counts.values())
    winner = next(answer for answer in answers if counts[answer] == top)
    return values[answers.index(winner)]


def test_subset_sizes_double_up_to_n():
    assert subset_sizes(1) == [] and subset_sizes(2) == [2] and subset_sizes(5) == [2, 4, 5] and subset_sizes(8) == [2, 4, 8]


def test_majority_vote_ties_go_to_the_first_answer_seen():
    assert majority_value([1.0, 0.0, 0.0], ["7", "8", "8"]) == 0.0
    assert majority_value([1.0, 0.0], ["7", "8"]) == 1.0
    assert majority_value([0.5, 1.0, 0.25, 0.0], ["a", "b", "a", "b"]) == 0.5


def test_mean_and_std_are_over_the_prompt_samples():
    metrics = prompt_metrics([1.0, 0.0, 0.0, 1.0], None)
    assert metrics["mean@4"] == 0.5 and metrics["std@4"] == pytest.approx(0.5)
    assert prompt_metrics([0.75], None) == {"mean@1": 0.75}


def test_best_worst_maj_match_a_plain_recomputation_on_the_same_draws():
    values, answers = [1.0, 0.0, 0.0, 0.5, 0.0], ["3", "4", "4", "3", "5"]
    metrics = prompt_metrics(values, answers)
    assert {m for m in metrics if "@" in m and "/" in m} == {f"{kind}@{k}/{stat}" for kind in ("best", "worst", "maj")
                                                             for k in (2, 4, 5) for stat in ("mean", "std")}
    for k in (2, 4, 5):
        draws = bootstrap_draws(len(values), k)
        assert draws.shape == (BOOTSTRAP_DRAWS, k)
        best = [max(values[i] for i in draw) for draw in draws]
        worst = [min(values[i] for i in draw) for draw in draws]
        maj = [plain_majority([values[i] for i in draw], [answers[i] for i in draw]) for draw in draws]
        for name, per_draw in (("best", best), ("worst", worst), ("maj", maj)):
            assert metrics[f"{name}@{k}/mean"] == pytest.approx(np.mean(per_draw), abs=1e-12)
            assert metrics[f"{name}@{k}/std"] == pytest.approx(np.std(per_draw), abs=1e-12)


def test_bootstrap_estimates_the_exact_expectation():
    """1000 draws: the estimate is within 4 standard errors of the exact E[max] / E[min] / E[maj]."""
    values, answers = [1.0, 0.0, 0.0, 1.0], ["a", "b", "b", "c"]
    metrics = prompt_metrics(values, answers)
    for k in (2, 4):
        for name, reduce in (("best", max), ("worst", min)):
            exact = exact_expectation(values, k, reduce)
            assert abs(metrics[f"{name}@{k}/mean"] - exact) <= 4 * metrics[f"{name}@{k}/std"] / BOOTSTRAP_DRAWS**0.5 + 1e-9
        draws = list(itertools.product(range(4), repeat=k))
        exact_maj = np.mean([plain_majority([values[i] for i in d], [answers[i] for i in d]) for d in draws])
        assert abs(metrics[f"maj@{k}/mean"] - exact_maj) <= 4 * metrics[f"maj@{k}/std"] / BOOTSTRAP_DRAWS**0.5 + 1e-9
    assert exact_expectation(values, 2, max) == 0.75  # the exact reference itself: 1 - P(both draws score 0)


def test_greedy_validation_names_the_core_metric_like_verl():
    by_source = source_metrics(["openai/gsm8k"] * 3 + ["lighteval/MATH"], ["0", "1", "2", "3"],
                               {"reward": [1.0, 0.0, 1.0, 0.0]})
    assert named_validation_metrics(by_source) == {
        "val-core/openai/gsm8k/reward/mean@1": pytest.approx(2 / 3),
        "val-core/lighteval/MATH/reward/mean@1": 0.0,
    }


def test_sampled_validation_is_averaged_per_prompt_and_split_into_core_and_aux():
    # two prompts x 2 samples; the reward function reports acc, so acc is the core variable
    infos = {"reward": [1.0, 0.0, 0.0, 0.0], "acc": [1.0, 0.0, 0.0, 0.0], "pred": ["7", "8", None, None]}
    metrics = named_validation_metrics(source_metrics(["s"] * 4, ["p", "p", "q", "q"], infos))
    assert metrics["val-core/s/acc/mean@2"] == 0.25
    assert metrics["val-aux/s/acc/std@2"] == pytest.approx(0.25)  # prompt p: std 0.5, prompt q: 0
    first_prompt = prompt_metrics([1.0, 0.0], ["7", "8"])
    assert metrics["val-core/s/acc/best@2/mean"] == pytest.approx(first_prompt["best@2/mean"] / 2)
    assert metrics["val-aux/s/acc/worst@2/mean"] == pytest.approx(first_prompt["worst@2/mean"] / 2)
    assert metrics["val-core/s/acc/maj@2/mean"] == pytest.approx(first_prompt["maj@2/mean"])  # q has no answers: no maj
    assert metrics["val-aux/s/reward/mean@2"] == 0.25 and "val-core/s/reward/mean@2" not in metrics
    assert not any(key.startswith("val-core/") and ("std@" in key or "worst@" in key) for key in metrics)
