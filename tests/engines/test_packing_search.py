"""The packed-row search (``packing.first_fit_rows``, ``packing.row_width``) against the plain
algorithms it shortcuts: first-fit scanning every row, and the cost minimised over every width."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.engines.common.batching.packing import ROW_WIDTH_MAX_MULTIPLE, ROW_WIDTH_STEPS, first_fit_rows, row_width

LENGTHS = st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=200)


def plain_first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    rows: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if lengths[index] == 0:
            continue
        fits = [row for row in rows if sum(lengths[i] for i in row) + lengths[index] <= capacity]
        if fits:
            fits[0].append(index)
        else:
            rows.append([index])
    return rows


@settings(max_examples=300, deadline=None)
@given(LENGTHS, st.integers(min_value=0, max_value=600))
def test_first_fit_places_every_sequence_where_a_full_scan_would(lengths, extra):
    capacity = max(lengths) + extra
    assert first_fit_rows(lengths, capacity) == plain_first_fit(lengths, capacity)


@settings(max_examples=300, deadline=None)
@given(LENGTHS.filter(lambda lengths: max(lengths) > 0), st.sampled_from([16, 128, 512, 896, 4096]))
def test_row_width_is_the_cheapest_of_all_widths_tried(lengths, hidden_size):
    longest = max(lengths)
    widths = range(longest, ROW_WIDTH_MAX_MULTIPLE * longest + 1, max(1, longest // ROW_WIDTH_STEPS))

    def cost(width: int) -> float:
        return len(plain_first_fit(lengths, width)) * width * (1.0 + width / (3.0 * hidden_size))

    assert row_width(lengths, hidden_size) == min(widths, key=cost)
