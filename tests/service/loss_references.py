"""The Tinker losses' per-token formulas as the Tinker docs state them, in plain PyTorch: the references of
``test_losses.py`` (the registry) and ``test_sdk_api.py`` (each loss through the SDK)."""

from __future__ import annotations

import torch


def _gspo(lp: torch.Tensor, q: torch.Tensor, adv: torch.Tensor, marked: torch.Tensor, cfg: dict) -> torch.Tensor:
    """Tinker's GSPO-token, row by row: s = exp(mean of log p/q over the marked tokens), s_t = sg(s) * p_t / sg(p_t)."""
    rows = []
    for row in range(lp.shape[0]):
        keep = marked[row] != 0
        s = torch.exp((lp[row].detach() - q[row])[keep].mean()) if keep.any() else torch.tensor(1.0)
        s_t = s * torch.exp(lp[row] - lp[row].detach())
        clipped = torch.clamp(s_t, cfg["clip_low_threshold"], cfg["clip_high_threshold"])
        rows.append(-torch.min(s_t * adv[row], clipped * adv[row]))
    return torch.stack(rows)


def token_losses(name: str, lp: torch.Tensor, q: torch.Tensor, adv: torch.Tensor, w: torch.Tensor, cfg: dict,
                 marked: torch.Tensor) -> torch.Tensor:
    """The per-token losses of Tinker loss `name` (`[B, T]` in, `[B, T]` out): log-probs `lp`, sampler log-probs `q`,
    advantages `adv`, weights `w`, its `cfg`, and gspo's `sequence_ratio_mask` `marked`."""
    ratio = torch.exp(lp - q)
    return {
        "gspo": lambda: _gspo(lp, q, adv, marked, cfg),
        "cross_entropy": lambda: -(lp * w),
        "importance_sampling": lambda: -(ratio * adv),
        "ppo": lambda: -torch.min(ratio * adv, torch.clamp(ratio, cfg["clip_low_threshold"], cfg["clip_high_threshold"]) * adv),
        "cispo": lambda: -(torch.clamp(ratio, cfg["clip_low_threshold"], cfg["clip_high_threshold"]).detach() * lp * adv),
        "dro": lambda: -(lp * adv - 0.5 * cfg["beta"] * (lp - q) ** 2),
    }[name]()
