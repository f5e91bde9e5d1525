"""``async_training.restart_rollout``: SIGKILL the rollout worker of a ``one_step_off`` run while it generates.

With restarts on, the run starts the rollout pool again with the actor's weights, sends the generation calls
in flight again, and finishes every step once (``async/rollout_restarts`` says 1 from then on). With them off,
the run ends within 60 s, non-zero, with one line naming the dead worker's group. Real Ray pools (actor,
rollout), FSDP2 and vLLM on CPU; the phase plugin (``phase_plugin.py``) says which process generates when.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlflow.utils.plugins import load_module_file
from tests.faults.run_watch import logged_steps, phase_lines, wait_for, worker_hosts
from tests.ppo.conftest import REPO, base_overrides, read_jsonl

PLUGIN = Path(__file__).resolve().parent / "phase_plugin.py"
phases = load_module_file(PLUGIN)
TOTAL = 3
BOUND_S = 60.0
pytestmark = pytest.mark.full


def _kill_the_rollout_while_it_generates(assets: dict[str, Path], run_dir: Path, restart: bool) -> tuple[int, str]:
    """Run ``main_ppo`` one step off; once step 1 is logged, SIGKILL the process that next enters ``generate``;
    returns the run's exit status and output."""
    markers = run_dir.parent / "markers"
    markers.mkdir()
    args = base_overrides(assets["model"], assets["data"], run_dir) + [
        f"trainer.plugins=[{PLUGIN}]", "rollout.name=phase_vllm", "data.val_files=[]", "trainer.placement=split",
        "async_training.mode=one_step_off", f"async_training.restart_rollout={str(restart).lower()}",
        f"trainer.total_training_steps={TOTAL}", "trainer.save_freq=-1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", phases.MARKER_ENV: str(markers), phases.HOLD_ENV: "generate"}
    proc = subprocess.Popen([sys.executable, "-m", "rlflow.trainer.main_ppo", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(proc, lambda: 1 in logged_steps(run_dir), "step 1's metrics line")
        before = len(phase_lines(markers, "generate"))
        pid = wait_for(proc, lambda: phase_lines(markers, "generate")[before:], "a generation after step 1")[0][0]
        assert pid in [host.pid for host in worker_hosts(proc.pid)], f"generate ran in {pid}, not in a WorkerHost"
        os.kill(pid, signal.SIGKILL)
        struck = time.monotonic()
        output, _ = proc.communicate(timeout=600 if restart else BOUND_S)
        assert restart or time.monotonic() - struck < BOUND_S
        return proc.returncode, output
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(1200)
def test_a_killed_rollout_worker_is_replaced_and_the_run_trains_every_step_once(fault_assets, tmp_path):
    returncode, output = _kill_the_rollout_while_it_generates(fault_assets, tmp_path / "run", restart=True)
    assert returncode == 0, output[-3000:]
    assert "starting rollout pool 'rollout' again (restart 1 of at most 3" in output, output[-3000:]
    assert logged_steps(tmp_path / "run") == list(range(1, TOTAL + 1)), "a step is missing or logged twice"
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["async/rollout_restarts"] for r in records] == [0, 1, 1] or \
        [r["async/rollout_restarts"] for r in records] == [0, 0, 1], [r["async/rollout_restarts"] for r in records]
    assert all(r["async/staleness/max"] <= 1 for r in records)
    assert records[-1]["actor/grad_norm"] > 0


@pytest.mark.timeout(900)
def test_without_restarts_a_killed_rollout_worker_ends_the_run_with_one_line_naming_its_group(fault_assets, tmp_path):
    returncode, output = _kill_the_rollout_while_it_generates(fault_assets, tmp_path / "run", restart=False)
    assert returncode != 0
    died = [line for line in output.splitlines() if "died while running" in line]
    assert died and "worker rank 0 of worker group 'rollout' died while running" in died[-1], output[-3000:]
    assert logged_steps(tmp_path / "run")[-1] < TOTAL
