"""Every listening socket of every process a GRPO run with vLLM starts is on loopback, at 1 and 2 workers; and the
run's console holds no library INFO lines (they are in the run folder's ``logs/``).

The run is ``main_ppo`` as users start it (a local cluster, the fsdp2 actor, the in-process vLLM rollout);
meanwhile its process tree and every process naming its Ray session folder are scanned for listening TCP
sockets twice a second: Ray's servers and agents, the worker hosts' rendezvous store and gloo's pairs,
vLLM's. ``tests/workers/test_ray_loopback.py`` checks a bare cluster; this one what a run adds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO, base_overrides
from listening_sockets import is_loopback, listeners, session_processes

SCAN_INTERVAL_S = 0.5
MAX_CONSOLE_LINES = 40  # a one-step run: rlflow's lines, the progress bar, what the libraries print outside logging


@pytest.mark.full
@pytest.mark.parametrize("workers", [1, 2])
def test_every_socket_of_a_grpo_run_with_vllm_is_on_loopback(tiny_model, addition_data, tmp_path, workers):
    ray_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths have a length limit
    overrides = base_overrides(tiny_model, addition_data, tmp_path / "run") + [
        "rollout=vllm", f"trainer.n_procs_per_node={workers}", "trainer.cpus_per_proc=1", "trainer.total_training_steps=1",
        "trainer.device=cpu", f"trainer.ray_temp_dir={ray_dir}"]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_AUTH_", "GLOO_", "NCCL_"))}
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        driver = subprocess.Popen([sys.executable, "-m", "rlflow.trainer.main_ppo", *overrides], cwd=REPO, env=env,
                                  stdout=out, stderr=subprocess.STDOUT)
        seen: dict[tuple[int, str, int], dict] = {}
        deadline = time.monotonic() + 900
        while driver.poll() is None and time.monotonic() < deadline:
            for entry in listeners(session_processes(ray_dir)):
                seen[(entry["pid"], entry["ip"], entry["port"])] = entry
            time.sleep(SCAN_INTERVAL_S)
        driver.kill()
        driver.wait()
    assert driver.returncode == 0, log.read_text()[-3000:]
    names = {entry["name"] for entry in seen.values()}
    assert {"gcs_server", "raylet"} <= names and any("WorkerHost" in name for name in names), names  # the scan saw them
    hosts = {entry["pid"] for entry in seen.values() if "WorkerHost" in entry["name"]}
    assert len(hosts) == workers, seen
    exposed = [entry for entry in seen.values() if not is_loopback(entry["ip"])]
    assert not exposed, f"listening beyond loopback: {exposed}"

    # The same run's console: the libraries' INFO lines went to the run folder's logs/, not to the console.
    console = log.read_text().split("\n")  # terminal lines (a progress bar's \r updates stay on one)
    assert len(console) <= MAX_CONSOLE_LINES, "\n".join(console)  # 18 measured at 2 workers; vLLM's INFO lines were >100
    assert not any("Failed to load weights" in line or "NUMA binding" in line for line in console)
    assert not any(" INFO " in line and "vllm" in line for line in console), "vLLM INFO lines reached the console"
    worker_logs = sorted((tmp_path / "run" / "logs").glob("worker-*.log"))
    assert len(worker_logs) == workers and all(" I [vllm." in path.read_text() for path in worker_logs), worker_logs
