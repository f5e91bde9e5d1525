"""A plugin file outside the package reaches every process: ``main_sft`` and ``main_ppo`` on real Ray, 2 workers.

``tests/plugins/user_plugin.py`` registers an FSDP2 subclass (``user_fsdp2``), a policy loss
(``user_vanilla``) and a reward (``user/digit_share``); each leaves a ``<kind>-<pid>`` marker
when it runs. Both command lines name the plugin by a path relative to the repository root, so
the workers (which run elsewhere) only find it through the driver's absolute path. The markers
show which processes imported the plugin and ran its code: the engine's optimizer step on both
worker ranks, the loss in those same workers, the reward in a reward worker process, and none
of them in the driver.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from rlflow.data.tasks import build_task, write_task_files
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "tests/plugins/user_plugin.py"  # relative on purpose: the driver makes it absolute
MARKER_ENV = "RLFLOW_PLUGIN_MARKERS"
REWARD_SOURCE = "user/digit_share"


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plugin_runs")
    files = write_task_files(build_task("addition", digits=2), root / "data", n_train=16, n_val=4, seed=0)
    rl_train = pd.read_parquet(files["train"]).assign(data_source=REWARD_SOURCE)  # scored by the plugin's reward
    rl_train.to_parquet(root / "data" / "user_train.parquet")
    model = build_preset(root / "tiny", tokenizer_corpus(), preset="tiny", seed=0)
    return {"model": model, "rl_train": root / "data" / "user_train.parquet", "sft_train": files["sft_train"]}


def ppo_overrides(assets: dict[str, Path], run_dir: Path, train_file: Path, batch: int, response_length: int) -> list[str]:
    """The one-step hf-rollout GRPO run both main_ppo plugin tests make, on ``train_file``."""
    return [f"model.path={assets['model']}", "model.preset=null", f"data.train_files=[{train_file}]", "data.val_files=[]",
            f"data.train_batch_size={batch}", f"data.max_response_length={response_length}",
            f"actor.ppo_mini_batch_size={batch}", "rollout=hf", "rollout.n=2", "trainer.total_training_steps=1",
            f"trainer.default_local_dir={run_dir}"]


def run_entry(module: str, args: list[str], markers: Path, timeout: float = 540) -> tuple[subprocess.CompletedProcess, int]:
    """``python -m <module> *args`` from the repo root on a 2-worker local Ray; (result, the driver's pid)."""
    ray_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    args = [*args, "trainer.n_procs_per_node=2", "trainer.device=cpu", "trainer.ray_num_cpus=2",
            f"trainer.ray_temp_dir={ray_dir}", "trainer.val_before_train=false"]
    env = {**os.environ, MARKER_ENV: str(markers), "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), proc.pid


def read_markers(directory: Path) -> dict[str, dict[int, str]]:
    """``{kind: {pid: text}}`` from the ``<kind>-<pid>`` files the plugin left."""
    found: dict[str, dict[int, str]] = defaultdict(dict)
    for path in directory.iterdir():
        kind, _, pid = path.name.rpartition("-")
        found[kind][int(pid)] = path.read_text()
    return found


def assert_engine_ran_on_both_workers(markers: dict[str, dict[int, str]], driver_pid: int) -> set[int]:
    engine = markers["engine"]
    assert sorted(engine.values()) == ["0", "1"], f"user_fsdp2 stepped on ranks {engine}"
    workers = set(engine)
    assert driver_pid not in workers
    assert {driver_pid} | workers <= set(markers["import"]), "the driver and every worker import the plugin"
    return workers


@pytest.mark.full  # make test: the main_ppo runs below run the plugin engine on both workers too
@pytest.mark.timeout(600)
def test_main_sft_runs_a_plugin_engine_on_ray_workers(assets, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    result, driver_pid = run_entry("rlflow.trainer.main_sft", [
        f"trainer.plugins=[{PLUGIN}]",
        "engine.name=user_fsdp2",
        f"engine.marker_dir={markers}",  # a key of the plugin's own config class
        "engine.lr_scheduler.name=constant",
        f"model.path={assets['model']}",
        "model.preset=null",
        f"data.train_files=[{assets['sft_train']}]",
        "data.val_files=[]",
        "data.train_batch_size=8",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ], markers)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_engine_ran_on_both_workers(read_markers(markers), driver_pid)


@pytest.mark.timeout(600)
def test_main_ppo_runs_plugin_engine_loss_and_reward_in_their_processes(assets, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    run_dir = tmp_path / "run"
    result, driver_pid = run_entry("rlflow.trainer.main_ppo", [
        f"trainer.plugins=[{PLUGIN}]",
        "actor.engine.name=user_fsdp2",
        f"actor.engine.marker_dir={markers}",
        "actor.policy_loss.loss_mode=user_vanilla",
        "reward.num_workers=1",
        *ppo_overrides(assets, run_dir, assets["rl_train"], batch=2, response_length=8),
    ], markers)
    assert result.returncode == 0, result.stderr[-4000:]
    found = read_markers(markers)
    workers = assert_engine_ran_on_both_workers(found, driver_pid)
    assert set(found["policy_loss"]) == workers, "user_vanilla is computed by both actor workers"
    reward_procs = set(found["reward"])
    assert reward_procs and not reward_procs & (workers | {driver_pid}), "the reward is scored in a reward worker"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1] and f"reward/source/{REWARD_SOURCE}/mean" in records[0]


@pytest.mark.timeout(600)
def test_main_ppo_runs_a_plugin_agent_loop_and_environment_in_the_rollout_workers(assets, tmp_path):
    """Half the rows name the plugin's loop (scored by the plugin's reward), half the ``env_agent`` loop over the
    plugin's environment (scored by it, ``env/*``); both run in the rollout workers only."""
    markers = tmp_path / "markers"
    markers.mkdir()
    rows = pd.read_parquet(assets["rl_train"])
    half = len(rows) // 2
    rows["agent_name"] = ["user_retry"] * half + ["env_agent"] * (len(rows) - half)
    rows["data_source"] = [REWARD_SOURCE] * half + ["env/user_digits"] * (len(rows) - half)
    rows["extra_info"] = [{**dict(extra), "env_class": "user_digits"} for extra in rows["extra_info"]]
    rows.to_parquet(tmp_path / "agent_rows.parquet")
    run_dir = tmp_path / "run"
    result, driver_pid = run_entry("rlflow.trainer.main_ppo", [
        f"trainer.plugins=[{PLUGIN},tests/plugins/agent_plugin.py]",
        f"actor.engine.marker_dir={markers}",
        "actor.engine.name=user_fsdp2",
        "rollout.multi_turn.enable=true",
        "data.shuffle=false",
        *ppo_overrides(assets, run_dir, tmp_path / "agent_rows.parquet", batch=16, response_length=24),
    ], markers)
    assert result.returncode == 0, result.stderr[-4000:]
    found = read_markers(markers)
    workers = assert_engine_ran_on_both_workers(found, driver_pid)
    assert set(found["agent_loop"]) == workers and set(found["env"]) == workers, "loops run in the rollout workers"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["num_turns"] > 1 and "reward/source/env/user_digits/mean" in records[0]
