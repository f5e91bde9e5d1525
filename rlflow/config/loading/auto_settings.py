"""``auto`` speed settings: decided once, on the controller, before Ray, and said in one start-up line.

Four keys are ``auto`` in rlflow's YAML: an HF-module engine's ``attn_implementation`` and
``share_prefix``, fsdp2's ``compile`` and the rollout's ``enforce_eager``. Each is set here to a
concrete value from what the run is (its device, its length in steps, GRPO's group size), before
the keys are typed, so the engines and the rollout only ever see ``true``/``false``/a kernel name.
A value written in config or on the command line is never changed. The rules, with the measurements
behind them in docs/benchmarks.md:

================  ======================================================  ==========================
key               ``auto`` on a CPU                                       on a GPU (or unknown)
================  ======================================================  ==========================
attn_impl...      ``sdpa_varlen`` with ``use_remove_padding`` (no filler   ``sdpa`` (no gain measured
                  rows in the linear layers: 3.5% faster update)           on an H200); Ulysses needs
                                                                          ``sdpa_varlen`` anywhere
share_prefix      on when rows share prompts (``rollout.n`` > 1) and      off
                  the kernel is ``sdpa_varlen`` without Ulysses (each
                  GRPO prompt computed once: 0.79x the update)
compile           on for a run of at least ``REPAYING_STEPS`` steps       off
                  without LoRA (the first step compiles, ~30 s; the
                  rest save 5-8%)
enforce_eager     ``false`` (vLLM's graphs) for a run of at least         ``false``: vLLM's own
                  ``REPAYING_STEPS`` steps (+24 s start-up, -6% decode)   default on CUDA (unknown:
                                                                          ``true``)
================  ======================================================  ==========================

"Unknown" is a controller that cannot know the workers' device: ``auto`` everywhere and a joined
Ray cluster (``compute_device``). A run's length is ``trainer.total_training_steps``; left null
(epochs over the data), it is unknown here and counts as short.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from rlflow.config.loading.dtype_guard import compute_device

AUTO = "auto"
REPAYING_STEPS = 500  # a shorter (or unknown-length) CPU run does not pay a first-step compile or vLLM's graph capture


@dataclass(frozen=True)
class RunShape:
    """What the ``auto`` rules read of a run: its device (None: unknown), steps (None: unknown), prompt group size."""

    device: Optional[str]
    steps: Optional[int]
    group_size: int = 1

    @property
    def repays_start_up(self) -> bool:
        return self.device == "cpu" and self.steps is not None and self.steps >= REPAYING_STEPS

    def describe(self) -> str:
        steps = "unknown length" if self.steps is None else f"{self.steps} steps"
        return f"{self.device or 'device unknown'}, {steps}, groups of {self.group_size}"


def _attn_implementation(node: DictConfig, run: RunShape) -> str:
    if _int(node.get("ulysses_sequence_parallel_size")) not in (None, 1):
        return "sdpa_varlen"
    return "sdpa_varlen" if run.device == "cpu" and node.get("use_remove_padding") is True else "sdpa"


def _share_prefix(node: DictConfig, run: RunShape) -> bool:
    return (run.device == "cpu" and run.group_size > 1 and node.get("attn_implementation") == "sdpa_varlen"
            and node.get("use_remove_padding") is True and _int(node.get("ulysses_sequence_parallel_size")) == 1)


def _compile(node: DictConfig, run: RunShape) -> bool:
    lora = node.get("lora")
    return run.repays_start_up and not (isinstance(lora, DictConfig) and (_int(lora.get("rank")) or 0) > 0)


def _enforce_eager(node: DictConfig, run: RunShape) -> bool:
    return not (run.device == "cuda" or run.repays_start_up)


Rules = dict[str, Callable[[DictConfig, RunShape], Any]]  # key -> the rule that sets it from the node and the run
# Resolved in this order (share_prefix reads the resolved attn_implementation).
ENGINE_RULES: Rules = {"attn_implementation": _attn_implementation, "share_prefix": _share_prefix, "compile": _compile}
ROLLOUT_RULES: Rules = {"enforce_eager": _enforce_eager}


def _int(value: Any) -> Optional[int]:
    """An int config value, or None for anything else (a bad value is reported later, by the typed checks)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RunKeys:
    """Where an entry point's config says how long a run is and how many rows share a prompt, and where its rollout is
    (None: the entry point has no such key)."""

    steps: Optional[str] = "trainer.total_training_steps"
    group_size: Optional[str] = None
    rollout: Optional[str] = None

    def shape(self, cfg: DictConfig, device_key: Optional[str]) -> RunShape:
        """The ``RunShape`` of the engine or rollout whose device is at ``device_key`` in the raw ``cfg``."""
        if device_key and OmegaConf.select(cfg, device_key, default=None) is None:
            device_key = None
        device = compute_device(cfg, device_key)
        steps = _int(OmegaConf.select(cfg, self.steps, default=None)) if self.steps else None
        group = _int(OmegaConf.select(cfg, self.group_size, default=None)) if self.group_size else None
        return RunShape(device=device if device in ("cpu", "cuda") else None, steps=steps, group_size=group or 1)


def _speed_nodes(cfg: DictConfig, mounts: Iterable[str], keys: RunKeys) -> Iterator[tuple[str, DictConfig, Rules]]:
    """Each engine node at ``mounts`` and the rollout node that ``cfg`` holds, with the rules of its speed keys."""
    for mount, rules in [*((mount, ENGINE_RULES) for mount in mounts), (keys.rollout, ROLLOUT_RULES)]:
        node = OmegaConf.select(cfg, mount, default=None) if mount else None
        if isinstance(node, DictConfig):
            yield mount, node, rules


def settle_auto_settings(cfg: DictConfig, engine_mounts: tuple[str, ...], keys: RunKeys) -> DictConfig:
    """A copy of the raw ``cfg`` with every ``auto`` speed key set by its rule."""
    cfg = copy.deepcopy(cfg)
    for mount, node, rules in _speed_nodes(cfg, engine_mounts, keys):
        run = keys.shape(cfg, f"{mount}.device")
        for key, rule in ((key, rule) for key, rule in rules.items() if node.get(key) == AUTO):
            with open_dict(node):
                node[key] = rule(node, run)
    return cfg


def speed_settings_line(config: DictConfig, mounts: Iterable[str], keys: RunKeys) -> str:
    """The start-up line a driver logs once its pre-Ray checks passed: the speed keys of the engines it uses
    (``mounts``) and of its rollout, as a validated ``config`` has them, and the run they were decided for."""
    parts = [f"{mount}: " + " ".join(f"{key}={_yaml(node[key])}" for key in rules if key in node)
             for mount, node, rules in _speed_nodes(config, mounts, keys) if any(key in node for key in rules)]
    run = keys.shape(config, "trainer.device")
    return (f"speed settings ({run.describe()}): {'; '.join(parts)} (auto values follow the device and the run's "
            f"length: compile and vLLM graphs on a CPU from {REPAYING_STEPS} steps; docs/engines.md#auto-settings)")


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
