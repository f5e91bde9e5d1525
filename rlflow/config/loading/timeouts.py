"""``trainer.timeouts``: the phase each role method belongs to, and the limits a worker group waits under.

Every call the driver makes to a worker group is bounded by the timeout of its phase
(``METHOD_PHASES`` maps the roles' methods to phases); a call that outlives it raises
``WorkerTimeoutError`` naming the phase, the role and method, and the ranks still running, and
the group is killed without a graceful close. Reward scoring in the driver is bounded by
``reward_s`` in ``RewardManager``. See docs/reliability/timeouts.md.
"""

from __future__ import annotations

from typing import Any

from rlflow.workers import CallLimit, GroupTimeouts

TIMEOUTS_KEY = "trainer.timeouts"
PHASES = ("init", "generate", "reward", "forward_backward", "sync", "save")

# A role's method -> the phase whose timeout bounds one call of it.
METHOD_PHASES: dict[str, str] = {
    "generate_sequences": "generate",
    "score_prompts": "generate",
    "compute_rm_score": "reward",
    "compute_log_prob": "forward_backward",
    "compute_ref_log_prob": "forward_backward",
    "compute_values": "forward_backward",
    "forward_backward": "forward_backward",
    "optim_step": "forward_backward",
    "zero_grad": "forward_backward",
    "update_critic": "forward_backward",
    "evaluate": "forward_backward",
    "sync_weights": "sync",
    "publish_weights": "sync",
    "update_weights": "sync",
    "update_weights_live": "sync",
    "publish_lora_adapter": "sync",
    "update_lora_adapter": "sync",
    "sync_sampler": "sync",
    "load_sampler": "sync",
    "sleep": "sync",
    "wake_up": "sync",
    "save_checkpoint": "save",
    "load_checkpoint": "save",
    "save_hf": "save",
    "save_lora_adapter": "save",
}


def phase_limit(timeouts: Any, phase: str) -> CallLimit:
    """The ``CallLimit`` of ``phase`` under a ``trainer.timeouts`` node."""
    return CallLimit(float(timeouts[f"{phase}_s"]), phase, f"{TIMEOUTS_KEY}.{phase}_s")


def resource_wait_s(trainer: Any) -> float:
    """How long a resource pool waits for the cluster to offer its bundles: ``connect_s`` when the run joins a cluster
    (nodes may still be joining it), none on the local cluster the run started (its resources are all there)."""
    return float(trainer.timeouts.connect_s) if trainer.ray_address else 0.0


def group_timeouts(timeouts: Any) -> GroupTimeouts:
    """A worker group's limits: start-up by ``init_s``, each role method by its phase, any other call by the longest."""
    longest = max(float(timeouts[f"{phase}_s"]) for phase in PHASES)
    return GroupTimeouts(
        init=phase_limit(timeouts, "init"),
        methods={method: phase_limit(timeouts, phase) for method, phase in METHOD_PHASES.items()},
        default=CallLimit(longest, "worker call", f"the longest of {TIMEOUTS_KEY}.*_s"),
    )
