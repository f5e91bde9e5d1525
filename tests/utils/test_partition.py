"""The one greedy partition behind rollout dispatch, batch balancing and dynamic micro-batches."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.utils.partition import balanced_partition


def _brute_force_best(weights: list[int], parts: int) -> int:
    """The smallest possible largest part sum over every split into equal-size parts."""
    size = len(weights) // parts

    def best(remaining: tuple[int, ...], left: int) -> int:
        if left == 1:
            return sum(weights[i] for i in remaining)
        first, rest = remaining[0], remaining[1:]  # the lowest index anchors a part: no symmetric repeats
        return min(
            max(sum(weights[i] for i in (first, *others)), best(tuple(i for i in rest if i not in others), left - 1))
            for others in itertools.combinations(rest, size - 1)
        )

    return best(tuple(range(len(weights))), parts)


def test_equal_size_parts_have_equal_counts_and_near_optimal_sums() -> None:
    weights = [50, 3, 41, 7, 7, 30, 12, 1, 22, 9, 18, 5]
    parts = balanced_partition(weights, 3, equal_size=True)
    assert sorted(itertools.chain(*parts)) == list(range(len(weights)))
    assert all(len(part) == 4 for part in parts)
    sums = sorted(sum(weights[i] for i in part) for part in parts)
    assert sums[-1] <= _brute_force_best(weights, 3) + max(weights) // 4
    assert sums[-1] - sums[0] <= max(weights)


def test_equal_size_needs_a_multiple_of_the_part_count() -> None:
    with pytest.raises(ValueError, match="equal parts"):
        balanced_partition([1, 2, 3], 2, equal_size=True)
    assert balanced_partition([], 2, equal_size=True) == [[], []]


def test_free_size_needs_an_item_per_part() -> None:
    with pytest.raises(ValueError, match="non-empty parts"):
        balanced_partition([1, 2], 3)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=30), st.integers(1, 8), st.booleans())
def test_every_item_lands_once_and_no_part_exceeds_the_mean_by_more_than_the_heaviest(
    weights: list[int], parts: int, equal_size: bool
) -> None:
    parts = min(parts, len(weights))
    if equal_size:
        weights = weights[: len(weights) - len(weights) % parts]
    partition = balanced_partition(weights, parts, equal_size=equal_size)
    assert sorted(i for part in partition for i in part) == list(range(len(weights)))
    assert all(part == sorted(part) for part in partition)
    if equal_size:
        assert {len(part) for part in partition} == {len(weights) // parts}
    else:
        assert all(partition)
    loads = [sum(weights[i] for i in part) for part in partition]
    assert max(loads) <= sum(weights) / parts + max(weights)
