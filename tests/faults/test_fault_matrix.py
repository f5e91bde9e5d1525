"""The fault matrix: SIGKILL the actor worker or the driver in each phase of a step, then resume.

Each case runs ``main_ppo`` (3 GRPO steps, a checkpoint every step) with the phase plugin
(tests/faults/phase_plugin.py), which writes a line when a process enters generate, update or
save and holds the targeted phase for a moment. Once checkpoint 1 is complete the test strikes
at the targeted point of step 2:

* worker cases: SIGKILL the ``WorkerHost`` process (a descendant of the driver) running the
  phase; the run must end non-zero within 60 s with the one-line ``WorkerDiedError`` message.
* driver cases: SIGKILL the driver; it and every process it started must be gone within 60 s,
  Ray's dashboard and runtime-env agents included (within 10 s: the watcher of
  rlflow/workers/cluster_reaper.py ends them; the test no longer kills them itself).

Then nothing is lost: the same command with ``trainer.resume_mode=auto`` resumes from the
last complete checkpoint, every step is in the jsonl exactly once, and every step's metrics
equal those of one uninterrupted reference run bit for bit (apart from timings, throughput and
memory: ``comparable``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rlflow.trainer.checkpoint import DRIVER_STATE
from rlflow.utils.plugins import load_module_file
from tests.faults.run_watch import logged_steps, phase_lines, wait_for, worker_hosts
from tests.ppo.conftest import REPO, base_overrides, comparable, read_jsonl, run_main_ppo

PLUGIN = Path(__file__).resolve().parent / "phase_plugin.py"
phases = load_module_file(PLUGIN)
TOTAL = 3
BOUND_S = 60.0  # from the fault to the documented outcome
pytestmark = pytest.mark.full


def overrides(fault_assets: dict[str, Path], run_dir: Path) -> list[str]:
    return base_overrides(fault_assets["model"], fault_assets["data"], run_dir) + [
        f"trainer.plugins=[{PLUGIN}]", "actor.engine=phase_fsdp2", "rollout.name=phase_vllm",
        "data.val_files=[]", f"trainer.total_training_steps={TOTAL}", "trainer.save_freq=1",
    ]


@pytest.fixture(scope="module")
def reference(fault_assets, tmp_path_factory) -> dict[int, dict]:
    """The uninterrupted run's metrics, by step."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = run_main_ppo(overrides(fault_assets, run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    records = {record["step"]: record for record in read_jsonl(run_dir / "metrics.jsonl")}
    assert sorted(records) == list(range(1, TOTAL + 1))
    assert records[TOTAL]["actor/grad_norm"] > 0, "the run never updated the policy, so the comparison has no teeth"
    return records


def complete_checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(path.name.split("_")[-1]) for path in run_dir.glob("global_step_*")
                  if path.name.split("_")[-1].isdigit() and (path / DRIVER_STATE).is_file())


def all_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` for ``procs`` to end; returns those still alive (zombies count as gone)."""
    deadline = time.monotonic() + timeout
    alive = procs
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    return alive


# Ray's agents, which alone would outlive a SIGKILLed driver by about a minute (rlflow/workers/cluster_reaper.py)
RAY_AGENTS = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}
AGENTS_GONE_S = 10.0  # from the driver's SIGKILL: the watcher's poll, SIGTERM and grace period

# (who is killed, the phase held, when to strike)
CASES = {
    "worker-generate": ("worker", "generate", "in"),
    "worker-update": ("worker", "update", "in"),
    "worker-save": ("worker", "save", "in"),
    "driver-before-generate": ("driver", "generate", "before"),
    "driver-generate": ("driver", "generate", "in"),
    "driver-update": ("driver", "update", "in"),
    "driver-save": ("driver", "save", "in"),
    "driver-after-metrics-before-save": ("driver", "save", "logged"),
}


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("case", list(CASES))
def test_a_killed_run_ends_as_documented_and_resumes_bit_exactly(case, fault_assets, reference, tmp_path):
    target, phase, when = CASES[case]
    run_dir, markers = tmp_path / "run", tmp_path / "markers"
    markers.mkdir()
    args = overrides(fault_assets, run_dir)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", phases.MARKER_ENV: str(markers), phases.HOLD_ENV: phase}
    proc = subprocess.Popen([sys.executable, "-m", "rlflow.trainer.main_ppo", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(proc, lambda: 1 in complete_checkpoints(run_dir), "checkpoint 1")
        before = len(phase_lines(markers, phase))  # the held phase of step 2 has not written its line yet
        if when == "in":
            pid = wait_for(proc, lambda: phase_lines(markers, phase)[before:], f"step 2's {phase}")[0][0]
        elif when == "logged":
            wait_for(proc, lambda: 2 in logged_steps(run_dir), "step 2's metrics line")
        hosts = worker_hosts(proc.pid)
        descendants = psutil.Process(proc.pid).children(recursive=True)
        struck = time.monotonic()
        if target == "worker":
            assert pid in [host.pid for host in hosts], f"{phase} ran in {pid}, not in a WorkerHost of the driver"
            os.kill(pid, signal.SIGKILL)
            output, _ = proc.communicate(timeout=BOUND_S)
            assert time.monotonic() - struck < BOUND_S
            assert proc.returncode != 0, output[-3000:]
            died = [line for line in output.splitlines() if "died while running" in line]
            assert died and "WorkerDiedError" in died[-1], output[-3000:]
        else:
            agents = [p for p in descendants if p.name() in RAY_AGENTS]
            assert {p.name() for p in agents} == RAY_AGENTS, [p.name() for p in descendants]
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=BOUND_S)
            left = all_gone(agents, AGENTS_GONE_S - (time.monotonic() - struck))
            assert not left, f"Ray's agents outlived the driver by {AGENTS_GONE_S:.0f} s: {[p.pid for p in left]}"
            left = all_gone(descendants, BOUND_S - (time.monotonic() - struck))
            assert not left, f"still running {BOUND_S:.0f} s after the driver died: {[p.cmdline()[:3] for p in left]}"
        print(f"{case}: outcome {time.monotonic() - struck:.1f} s after the kill")
        if when == "before":
            assert len(phase_lines(markers, "generate")) == before, "step 2's generate had begun"
        if when == "logged":
            assert 2 not in complete_checkpoints(run_dir), "checkpoint 2 was complete: not between the line and the save"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers of a failed assertion above
        except ProcessLookupError:
            pass

    last = complete_checkpoints(run_dir)[-1]
    assert last >= 1
    resumed = run_main_ppo(args + ["trainer.resume_mode=auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {run_dir / f'global_step_{last}'}" in resumed.stdout + resumed.stderr
    assert logged_steps(run_dir) == list(range(1, TOTAL + 1)), "a step is missing or logged twice"
    records = {record["step"]: record for record in read_jsonl(run_dir / "metrics.jsonl")}
    for step in range(1, TOTAL + 1):
        assert comparable(records[step]) == comparable(reference[step]), f"step {step} differs from the uninterrupted run"
