"""The drivers: the PPO/GRPO loop, the SFT loop, their Hydra entry points, placement and driver checkpoints.

The batch math they run lives in ``rlflow.algos``; metrics and reports in ``rlflow.observability``.
"""
