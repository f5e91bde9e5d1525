"""No unbounded wait: a hung reward function or a hung worker ends the run with one line naming the phase.

Hangs are injected by test code: a reward function (tests/faults/hang_reward.py) and an engine
registered by a plugin (tests/faults/timeout_plugin.py). The unit tests bound the
reward manager directly (in the driver and in worker processes); the runs go through
``main_ppo`` the way users run it, with small ``trainer.timeouts``, and must exit 2 within 60 s
of the limit with the documented message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlflow.data.tasks import build_task, write_task_files
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.errors import UserError
from rlflow.models.presets import build_preset
from rlflow.protocol import DataProto
from rlflow.rewards.deadline import RewardTimeoutError
from rlflow.rewards.manager import RewardManager
from rlflow.roles.actor import Actor
from rlflow.roles.actor_rollout_ref import ActorRolloutRef
from rlflow.roles.critic import Critic
from rlflow.roles.reference import Reference
from rlflow.roles.reward_model import RewardModel
from rlflow.roles.rollout_worker import RolloutWorker
from rlflow.roles.sft_worker import SFTWorker
from rlflow.trainer.entry_points import compose_ppo_config
from rlflow.config.loading.timeouts import METHOD_PHASES, PHASES, group_timeouts
from rlflow.utils.plugins import load_module_file
from rlflow.workers.decorator import registered_methods

REPO = Path(__file__).resolve().parents[2]
PLUGIN = Path(__file__).resolve().parent / "timeout_plugin.py"
HANG_REWARD = Path(__file__).resolve().parent / "hang_reward.py"
BOUND_S = 60.0  # from the hang's limit to the end of the run
MARKER_ENV = load_module_file(HANG_REWARD).MARKER_ENV


class CharTokenizer:
    """Decodes token ids as characters: enough for the reward manager."""

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(65 + t % 26) for t in row) for row in rows]


def reward_batch(n: int = 4) -> DataProto:
    responses = torch.arange(n * 3).reshape(n, 3)
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": torch.ones_like(responses)},
        non_tensors={"data_source": np.array(["synthetic/addition"] * n, dtype=object),
                     "ground_truth": np.array(["1"] * n, dtype=object)},
    )


def reward_config(function: str, num_workers: int):
    return OmegaConf.create({"custom_function": f"{HANG_REWARD}:{function}", "num_workers": num_workers, "error_score": 0.0})


def hangs(markers: Path) -> dict[int, float]:
    """pid -> when it started to hang, from the plugin's marker files."""
    return {int(path.name.split("-")[1]): float(path.read_text()) for path in markers.glob("hang-*")}


def is_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (exited, or a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith(("Z", "X"))
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_hung_reward_function_times_out_the_batch(num_workers, tmp_path, monkeypatch):
    monkeypatch.setenv(MARKER_ENV, str(tmp_path))
    manager = RewardManager(CharTokenizer(), reward_config("sleeping_reward", num_workers), timeout_s=5.0)
    if num_workers:  # start the worker processes first, so the limit measures the hang, not their start-up
        [future.result() for future in [manager._get_pool().submit(time.sleep, 1.0) for _ in range(num_workers)]]
    start = time.monotonic()
    try:
        with pytest.raises(RewardTimeoutError) as raised:
            manager(reward_batch())
        elapsed = time.monotonic() - start
        assert manager._pool is None, "a timed-out pool is dropped; the next batch starts a fresh one"
    finally:
        manager.close()
    message = str(raised.value)
    assert isinstance(raised.value, UserError) and "\n" not in message
    assert message.startswith("reward phase timed out") and "trainer.timeouts.reward_s" in message
    assert ("reward worker processes on samples 0-1, samples 2-3" if num_workers else "in the driver, on 4 samples") in message
    assert 5.0 <= elapsed < 5.0 + 10, elapsed
    hung = hangs(tmp_path)
    if num_workers:
        assert hung and os.getpid() not in hung, "the reward ran in the worker processes"
        deadline = time.monotonic() + 10
        while not all(is_gone(pid) for pid in hung) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(is_gone(pid) for pid in hung), "the hung reward workers must be killed"
    else:
        assert list(hung) == [os.getpid()]


def test_the_deadline_keeps_scores_and_errors_of_a_fast_batch(tmp_path):
    rewards = tmp_path / "rewards.py"
    rewards.write_text("def length(data_source, solution_str, ground_truth, extra_info):\n"
                       "    if solution_str.startswith('A'):\n        raise ValueError('no')\n"
                       "    return float(len(solution_str))\n")
    config = OmegaConf.create({"custom_function": f"{rewards}:length", "num_workers": 0, "error_score": -1.0})
    with RewardManager(CharTokenizer(), config, timeout_s=30.0) as manager:
        scores, metrics = manager(reward_batch())
    assert scores[:, -1].tolist() == [-1.0, 3.0, 3.0, 3.0] and metrics["reward/error_count"] == 1.0


ROLE_CLASSES = (Actor, ActorRolloutRef, Critic, Reference, RewardModel, RolloutWorker, SFTWorker)


def test_every_role_method_has_a_phase():
    """A new @register-ed role method must be given a phase (rlflow/config/loading/timeouts.py METHOD_PHASES)."""
    methods = {name for cls in ROLE_CLASSES for name in registered_methods(cls)}
    assert methods - set(METHOD_PHASES) == set()
    assert set(METHOD_PHASES.values()) <= set(PHASES)


def test_group_timeouts_follow_the_config():
    timeouts = compose_ppo_config(["trainer.timeouts.generate_s=5", "trainer.timeouts.save_s=9000"]).trainer.timeouts
    limits = group_timeouts(timeouts)
    generate = limits.for_method("generate_sequences")
    assert (generate.timeout_s, generate.phase, generate.config_key) == (5.0, "generate", "trainer.timeouts.generate_s")
    assert limits.for_method("save_hf").timeout_s == 9000.0 and limits.init.phase == "init"
    assert limits.for_method("mesh_info").timeout_s == 9000.0  # any other call: the longest limit
    with pytest.raises(UserError, match="trainer.timeouts.sync_s"):
        compose_ppo_config(["trainer.timeouts.sync_s=-1"])


# ---------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("timeouts")
    files = write_task_files(build_task("addition", digits=2), root / "data", n_train=16, n_val=4, seed=0)
    return {"model": build_preset(root / "tiny", tokenizer_corpus(), preset="tiny", seed=0), **files}


def run_ppo(assets: dict[str, Path], run_dir: Path, args: list[str], timeout: float = 420) -> tuple[subprocess.CompletedProcess, dict[int, float], float]:
    """``python -m rlflow.trainer.main_ppo`` on a local Ray with the hang plugin: the result, its hangs, and when it ended."""
    ray_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    markers = run_dir.parent / "markers"
    markers.mkdir()
    args = [f"trainer.plugins=[{PLUGIN}]", f"model.path={assets['model']}", "model.preset=null",
            f"data.train_files=[{assets['train']}]", "data.val_files=[]", "data.train_batch_size=4",
            "data.max_response_length=8", "actor.ppo_mini_batch_size=2", "rollout=hf", "rollout.n=2",
            "trainer.total_training_steps=2", "trainer.device=cpu", "trainer.ray_num_cpus=2", f"trainer.ray_temp_dir={ray_dir}",
            "trainer.val_before_train=false", "trainer.logger=[console,jsonl]", f"trainer.default_local_dir={run_dir}", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", MARKER_ENV: str(markers)}
    try:
        result = subprocess.run([sys.executable, "-m", "rlflow.trainer.main_ppo", *args], cwd=REPO, capture_output=True,
                                text=True, env=env, timeout=timeout)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    return result, hangs(markers), time.time()


def error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


@pytest.mark.full
def test_a_hung_reward_function_ends_the_run(assets, tmp_path):
    limit_s = 5.0
    result, hung, ended = run_ppo(assets, tmp_path / "run", [f"reward.custom_function={HANG_REWARD}:sleeping_reward",
                                                             f"trainer.timeouts.reward_s={limit_s}"])
    line = error_line(result)
    assert "reward phase timed out" in line and f"within {limit_s} s" in line and "trainer.timeouts.reward_s" in line, line
    assert len(hung) == 1 and ended - min(hung.values()) < limit_s + BOUND_S, (hung, ended)


@pytest.mark.full
def test_a_hung_worker_ends_the_run(assets, tmp_path):
    """Rank 1 sleeps in forward_backward, rank 0 waits for it in the collective: both are still running."""
    limit_s = 20.0
    result, hung, ended = run_ppo(assets, tmp_path / "run", ["actor.engine=hang_fsdp2", "trainer.n_procs_per_node=2",
                                                             "trainer.cpus_per_proc=0.5",
                                                             f"trainer.timeouts.forward_backward_s={limit_s}"])
    line = error_line(result)
    assert "forward_backward phase timed out: actor.forward_backward" in line, line
    assert "ranks [0, 1] of worker group 'colocated'" in line and "trainer.timeouts.forward_backward_s" in line, line
    assert len(hung) == 1 and ended - min(hung.values()) < limit_s + BOUND_S, (hung, ended)
