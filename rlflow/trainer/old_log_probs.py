"""Where a PPO step's old log-probs come from: a separate forward pass, or the update's own forward.

When the actor update is exactly on-policy - one PPO epoch over one mini-batch that is the
whole rollout batch - and nothing reads the old log-probs before the update, the old
log-probs are the update forward's own log-probs: gradients accumulate over the micro-batches
but no optimizer step runs before every row has been through the forward, so the weights
that would compute the old log-probs are the weights of the update forward. The policy loss
then takes the detached current log-probs as old (ratio exactly 1, ``ppo_kl`` exactly 0), and
the separate forward pass is skipped. ``actor.recompute_old_log_probs`` picks the policy:

* ``auto``: reuse the update's forward where ``recompute_reason`` finds nothing against it;
* ``always``: always run the separate forward pass.

Rollout correction keeps the reuse when it only weights, each weight from its own sample
(``weights_only_per_sample``: ``rollout_is`` without rejection or batch normalization): the loss
computes the weights from the update forward's detached log-probs and the rollout's, as the
separate pass would have. Rejection and batch-normalized weights change the batch before the
update (a separate pass computes the old log-probs), and in bypass mode the old log-probs are the
rollout's own (no pass at all: ``RolloutCorrection`` in ``phases``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import torch

from rlflow.algos.rollout_correction import BYPASS, DECOUPLED, correction_mode, correction_settings, weights_only_per_sample
from rlflow.models.hf_checkpoint import ModelFileError
from rlflow.protocol import DataProto
from rlflow.utils.text_files import read_json

# Model config keys whose non-zero value makes a training-mode forward differ from an
# evaluation-mode one (the separate pass runs in evaluation mode, the update in training mode).
TRAIN_MODE_ONLY_KEY_PARTS = ("dropout", "pdrop", "jitter")


def _correction_mode(cfg: Any) -> Optional[str]:
    return correction_mode(correction_settings(cfg.algorithm.rollout_correction))


def _corrects_before_update(cfg: Any) -> bool:
    settings = correction_settings(cfg.algorithm.rollout_correction)
    return correction_mode(settings) == DECOUPLED and not weights_only_per_sample(settings)


# (why the update's forward cannot give the old log-probs, whether that holds for a config); checked in order.
RecomputeRule = tuple[str, Callable[[Any], bool]]
RECOMPUTE_RULES: tuple[RecomputeRule, ...] = (
    ("algorithm.rollout_correction.bypass_mode: the old log-probs are the rollout's (no old-log-prob pass)",
     lambda cfg: _correction_mode(cfg) == BYPASS),
    ("algorithm.rollout_correction: its rejection or batch-normalized weights change the batch before the update",
     _corrects_before_update),
    ("actor.recompute_old_log_probs=always", lambda cfg: cfg.actor.recompute_old_log_probs == "always"),
    ("actor.ppo_epochs > 1: later epochs run after optimizer steps",
     lambda cfg: cfg.actor.ppo_epochs != 1),
    ("actor.ppo_mini_batch_size < data.train_batch_size: later mini-batches run after optimizer steps",
     lambda cfg: cfg.actor.ppo_mini_batch_size != cfg.data.train_batch_size),
    ("algorithm.use_kl_in_reward: the KL penalty reads the old log-probs before the update",
     lambda cfg: bool(cfg.algorithm.use_kl_in_reward)),
)


def train_mode_only_settings(model_path: str | Path) -> dict[str, float]:
    """Non-zero dropout-like settings in ``model_path``'s ``config.json`` (nested configs included)."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return {}
    found: dict[str, float] = {}

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 \
                    and any(part in key.lower() for part in TRAIN_MODE_ONLY_KEY_PARTS):
                found[f"{prefix}{key}"] = float(value)

    model_config = read_json(config_file, ModelFileError, "model file")
    walk(model_config if isinstance(model_config, dict) else {}, "")
    return found


def recompute_reason(config: Any, model_path: Optional[str | Path] = None) -> Optional[str]:
    """Why this run's old log-probs cannot be the update forward's (a separate forward pass computes them,
    or in bypass mode the rollout's are taken); ``None``: reuse the update's.

    ``model_path`` (the actor's HF folder) is checked for dropout: a training-mode forward with
    dropout does not give the evaluation-mode log-probs.
    """
    for reason, applies in RECOMPUTE_RULES:
        if applies(config):
            return reason
    settings = train_mode_only_settings(model_path) if model_path is not None else {}
    if settings:
        named = ", ".join(f"{key}={value:g}" for key, value in sorted(settings.items()))
        return f"the model has dropout ({named}): the update forward runs in training mode"
    return None


def in_batch_order(outputs: DataProto, rows: torch.Tensor) -> DataProto:
    """``outputs`` of a mini-batch that holds batch ``rows`` (in that order), put back in batch row order."""
    return outputs[torch.argsort(rows)]
