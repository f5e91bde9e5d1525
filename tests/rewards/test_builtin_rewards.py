"""Built-in rule rewards and the registry, on hand-written cases."""

from __future__ import annotations

import pytest

from rlflow.rewards import REWARD_REGISTRY, UnknownDataSourceError, get_reward_fn
from rlflow.rewards.math_boxed import last_boxed

GSM8K_CASES = [
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "72", 1.0),
    ("#### 1,000", "1000", 1.0),
    ("#### $1000", "1000", 1.0),
    ("#### 2.50", "2.5", 1.0),
    ("#### -3", "-3", 1.0),
    ("#### 5\nwait, no.\n#### 72", "72", 1.0),  # the last marker counts
    ("#### 72\nactually #### 5", "72", 0.0),
    ("#### 71", "72", 0.0),
    ("The answer is 72", "72", 0.0),  # strict: no marker, no credit
    ("#### seventy-two", "72", 0.0),
    ("#### 72", "She has 3*24 = 72 left.\n#### 72", 1.0),  # full GSM8K solution as ground truth
    ("#### 72", ["70", "72"], 1.0),  # any acceptable answer
]


@pytest.mark.parametrize("data_source", ["openai/gsm8k", "gsm8k"])
@pytest.mark.parametrize("solution,truth,expected", GSM8K_CASES)
def test_gsm8k(data_source, solution, truth, expected):
    assert get_reward_fn(data_source)(data_source, solution, truth, {}) == expected


MATH_CASES = [
    (r"so the answer is $\boxed{\frac{1}{2}}$.", r"\frac12", 1.0),
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{\dfrac{3}{4}}", "3/4", 1.0),
    (r"\boxed{\sqrt{2}}", r"\sqrt{2}", 1.0),
    (r"\boxed{\left( 1, 2 \right)}", "(1,2)", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{10^\circ}", "10", 1.0),
    (r"\boxed{\text{(A)}}", "(A)", 1.0),
    (r"\boxed{50\%}", "50", 1.0),
    (r"\fbox{7}", "7", 1.0),
    (r"$\boxed 7$", "7", 1.0),
    (r"\boxed{3} then \boxed{4}", "4", 1.0),  # the last box counts
    (r"\boxed{4}", r"The total is $\boxed{4}$.", 1.0),  # boxed ground truth
    (r"\boxed{3}", "4", 0.0),
    (r"\boxed{\sqrt{3}}", r"\sqrt{2}", 0.0),
    ("the answer is 4", "4", 0.0),  # no box, no credit
    (r"\boxed{4", "4", 0.0),  # unclosed
]


@pytest.mark.parametrize("data_source", ["math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval"])
@pytest.mark.parametrize("solution,truth,expected", MATH_CASES)
def test_boxed_math(data_source, solution, truth, expected):
    assert get_reward_fn(data_source)(data_source, solution, truth, {}) == expected


def test_last_boxed_handles_nested_braces():
    assert last_boxed(r"\boxed{\frac{a}{\sqrt{b}}} end") == r"\frac{a}{\sqrt{b}}"
    assert last_boxed("no box here") is None


@pytest.mark.parametrize(
    "data_source,solution,truth,expected",
    [
        ("synthetic/addition", "123+456=579\n#### 579", "579", 1.0),
        ("synthetic/addition", "#### 578", "579", 0.0),
        ("synthetic/addition", "579", "579", 0.0),
        ("synthetic/chain_arith", "10+5=15\n15-3=12\n#### 12", "12", 1.0),
    ],
)
def test_synthetic_tasks_use_the_task_score(data_source, solution, truth, expected):
    assert get_reward_fn(data_source)(data_source, solution, truth, {}) == expected


def test_unknown_data_source_lists_the_registered_ones():
    with pytest.raises(UnknownDataSourceError) as info:
        get_reward_fn("synthetic/no_such_task")
    message = str(info.value)
    assert "'synthetic/no_such_task'" in message
    for registered in ("openai/gsm8k", "lighteval/MATH", "synthetic/addition"):
        assert registered in message


def test_registry_exact_key_beats_pattern_and_longer_pattern_wins(clean_registry):
    @REWARD_REGISTRY.register("myorg/*")
    def broad(*args):
        return 0.0

    @REWARD_REGISTRY.register("myorg/math/*")
    def narrow(*args):
        return 1.0

    @REWARD_REGISTRY.register("myorg/math/special")
    def exact(*args):
        return 2.0

    assert get_reward_fn("myorg/chat") is broad
    assert get_reward_fn("myorg/math/algebra") is narrow
    assert get_reward_fn("myorg/math/special") is exact
    with pytest.raises(ValueError, match="already registered"):
        REWARD_REGISTRY.register("myorg/*")(narrow)
    REWARD_REGISTRY.register("myorg/*", override=True)(narrow)
    assert get_reward_fn("myorg/chat") is narrow
