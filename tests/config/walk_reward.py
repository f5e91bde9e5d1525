"""Reward functions the verl key walk names (``custom_reward_function.path`` / ``.name``): config loading imports
the file and checks their signatures before it accepts the keys."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0


def walk_fn(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0
