"""Bounding a batch of reward scoring in time, in the driver or in reward worker processes.

``run_with_deadline`` runs an in-process call in a daemon thread and stops waiting after the
deadline. Python cannot stop a thread, so an abandoned call keeps running (and holding what it
holds) until the process exits; the driver raises ``RewardTimeoutError`` and ends the run, so
that is soon. Reward worker processes (``reward.num_workers > 0``) can be killed instead:
``kill_pool`` does it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Optional

from rlflow.errors import UserError

TIMEOUT_KEY = "trainer.timeouts.reward_s"


class RewardTimeoutError(UserError, TimeoutError):
    """Scoring a batch did not finish in time; the message names what was still running and the key to raise."""

    def __init__(self, timeout_s: float, still_running: str):
        self.timeout_s = timeout_s
        super().__init__(
            f"reward phase timed out: scoring did not finish within {timeout_s:.1f} s ({still_running} still running); "
            f"raise {TIMEOUT_KEY} if the reward is legitimately this slow, else fix the hanging reward function"
        )


def run_with_deadline(fn: Callable[..., Any], args: tuple, timeout_s: Optional[float], what: str) -> Any:
    """``fn(*args)`` in a daemon thread, waited on for ``timeout_s`` (None: no limit); its exception re-raises here."""
    if timeout_s is None:
        return fn(*args)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread as is
            outcome["error"] = error

    thread = threading.Thread(target=target, name="rlflow-reward", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RewardTimeoutError(timeout_s, what)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Kill the worker processes of ``pool`` (hung in a reward function) and drop its queued work.

    ``ProcessPoolExecutor`` has no public way to kill its workers before Python 3.14
    (``terminate_workers``), so this reads its process table.
    """
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
