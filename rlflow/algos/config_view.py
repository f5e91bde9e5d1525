"""Read actor-config fields from any attribute object (dataclass, OmegaConf, SimpleNamespace).

Policy losses receive the actor config (``actor.*`` keys). Missing or ``None`` fields fall
back to verl's defaults, so a ``types.SimpleNamespace`` with just the fields a loss uses works.
"""

from __future__ import annotations

from typing import Any

from rlflow.algos.aggregation import check_global_batch_info

DEFAULT_CLIP_RATIO_C = 3.0
DEFAULT_TAU_POS = 1.0
DEFAULT_TAU_NEG = 1.05


def config_value(config: Any, name: str, default: Any = None) -> Any:
    """``config.name``, or ``default`` when the object lacks it or it is ``None``."""
    value = getattr(config, name, None) if config is not None else None
    return default if value is None else value


def policy_loss_value(config: Any, name: str, default: Any) -> Any:
    """``config.policy_loss.name`` with a default (``actor.policy_loss.*`` keys)."""
    return config_value(config_value(config, "policy_loss"), name, default)


def clip_bounds(config: Any, loss_name: str) -> tuple[float, float]:
    """``(clip_ratio_low, clip_ratio_high)``, each defaulting to ``clip_ratio``."""
    clip_ratio = config_value(config, "clip_ratio")
    low = config_value(config, "clip_ratio_low", clip_ratio)
    high = config_value(config, "clip_ratio_high", clip_ratio)
    if low is None or high is None:
        raise ValueError(
            f"policy loss {loss_name!r} needs actor.clip_ratio (or both actor.clip_ratio_low and "
            f"actor.clip_ratio_high) in its config"
        )
    return float(low), float(high)


def aggregation_kwargs(config: Any) -> dict[str, Any]:
    """``agg_loss`` keyword arguments from ``config.global_batch_info`` and ``config.loss_scale_factor``.

    The actor role fills ``global_batch_info`` (``dp_size``, ``batch_num_tokens``,
    ``global_batch_size``) per mini-batch so micro-batch losses use global counts.
    """
    kwargs = check_global_batch_info(config_value(config, "global_batch_info"))
    scale = config_value(config, "loss_scale_factor")
    if scale is not None:
        kwargs.setdefault("loss_scale_factor", scale)
    return kwargs
