"""A dense test reward: the share of digit characters in the response.

An untrained model never answers the synthetic task correctly, so the rule reward is 0
everywhere and GRPO's advantages vanish; this reward varies between samples, so the
driver tests exercise real policy updates. Loaded through ``reward.custom_function``.
"""


def digit_share(data_source, solution_str, ground_truth, extra_info=None):
    return sum(ch.isdigit() for ch in solution_str) / max(len(solution_str), 1)


def digit_share_and_answer(data_source, solution_str, ground_truth, extra_info=None):
    """``digit_share`` plus the response's last run of digits as its answer (``pred``, voted on by maj@N)."""
    runs = "".join(ch if ch.isdigit() else " " for ch in solution_str).split()
    return {"score": digit_share(data_source, solution_str, ground_truth), "pred": runs[-1] if runs else None}
