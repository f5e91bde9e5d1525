"""``main_ppo`` on an existing two-node Ray cluster (issue 44): two raylets on this machine, started with ``ray start``
on loopback with token authentication, one CPU each, joined through ``trainer.ray_address``.

* split placement: the actor pool and the rollout pool each need a whole node's CPU, so they land on different
  nodes; the weights cross between the nodes through Ray's object store after every update;
* colocated, ``trainer.nnodes=2``: one worker group spanning both nodes (a process on each, joined by gloo).

Each run finishes its GRPO steps; where each group ran is read from the driver's start-up lines (``group 'NAME':
N worker(s) on node(s) [...]``). ``docs/multinode.md`` walks the same start on real machines.
"""

from __future__ import annotations

import ast
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from conftest import base_overrides, read_jsonl, run_main_ppo

RAY = str(Path(sys.executable).parent / "ray")
GROUP_LINE = re.compile(r"group '(\w+)': \d+ worker\(s\) on node\(s\) (\[.*?\])")
STEPS = 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop(temp_dir: str) -> None:
    """Kill the processes of the cluster under ``temp_dir`` and their children (``ray stop`` would kill every Ray
    process of the machine, other tests' included)."""
    procs = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if temp_dir in " ".join(proc.info["cmdline"] or []):
                procs += [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


@pytest.fixture(scope="module")
def two_nodes():
    """The cluster's address and the environment (its token) a driver joins it with."""
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    address = f"127.0.0.1:{_free_port()}"
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", f"--port={address.split(':')[1]}", f"--temp-dir={temp_dir}",
                        "--include-dashboard=false", *common], env=env, check=True, capture_output=True, timeout=180)
        subprocess.run([RAY, "start", f"--address={address}", *common], env=env, check=True, capture_output=True,
                       timeout=180)
        yield SimpleNamespace(address=address, env=env)
    finally:
        _stop(temp_dir)


def _groups(output: str) -> dict[str, list[str]]:
    """Each worker group the driver started, with the nodes its workers ran on."""
    return {name: ast.literal_eval(nodes) for name, nodes in GROUP_LINE.findall(output)}


def _run(two_nodes, model: Path, data: Path, run_dir: Path, extra: list[str]) -> dict[str, list[str]]:
    overrides = base_overrides(model, data, run_dir) + [
        f"trainer.ray_address={two_nodes.address}", "trainer.ray_num_cpus=null", "data.val_files=[]",
        f"trainer.total_training_steps={STEPS}", *extra]
    result = run_main_ppo(overrides, env=two_nodes.env)
    assert result.returncode == 0, result.stderr[-4000:]
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)) and records[0]["actor/grad_norm"] > 0
    return _groups(result.stdout + result.stderr)


def test_split_placement_puts_the_actor_and_the_rollout_on_different_nodes(two_nodes, tiny_model, addition_data,
                                                                           tmp_path):
    groups = _run(two_nodes, tiny_model, addition_data, tmp_path / "run",
                  ["trainer.placement=split", "rollout.num_replicas=1"])
    assert set(groups) == {"actor", "rollout"}, groups
    assert len(groups["actor"]) == len(groups["rollout"]) == 1 and groups["actor"] != groups["rollout"], groups


@pytest.mark.full
def test_a_colocated_group_spans_both_nodes(two_nodes, tiny_model, addition_data, tmp_path):
    groups = _run(two_nodes, tiny_model, addition_data, tmp_path / "run", ["trainer.nnodes=2"])
    assert list(groups) == ["colocated"] and len(set(groups["colocated"])) == 2, groups
