"""Batch columns that several phases name."""

from __future__ import annotations

# What a generate phase adds for each sample (``rlflow.rollout.processing.build_rollout_output``); every
# prompt column (``uid``, ``data_source``, ``ground_truth`` ...) passes through, repeated ``rollout.n`` times.
ROLLOUT_COLUMNS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids")
# ... and with ``rollout.calculate_log_probs``: the rollout's log-prob of each sampled token.
ROLLOUT_LOG_PROBS = "rollout_log_probs"

# What a role's forward over prompt + response reads (``rlflow.roles.batch_views.engine_batch``).
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")

# What the rule rewards read besides the responses (``rlflow.rewards.manager.RewardManager``).
RULE_REWARD_INPUTS = ("responses", "response_mask", "data_source", "ground_truth")
