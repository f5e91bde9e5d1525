"""tinker-cookbook's minimal loops, ``recipes/sl_loop.py`` and ``recipes/rl_loop.py``, unmodified against
the service (full tier: it builds ``.venv-cookbook`` with pip and trains a warm start first).

The loops name hub things: the registry model ``Qwen/Qwen3-8B-Base`` (its tokenizer; its renderer, role_colon,
from the cookbook's registry) and the datasets ``HuggingFaceH4/no_robots`` and ``openai/gsm8k``.
``scripts/cookbook_offline_hub.py`` writes an ``HF_HOME`` where ``HF_HUB_OFFLINE=1`` finds them: the tiny
preset's tokenizer under that name and rlflow's chain-arithmetic task in the datasets' columns. The service serves
the name from a warm start rlflow's SFT trained on the stand-in chats in the role_colon layout (boxed answers), so
the RL loop starts from a model that sometimes answers right. The loops get arguments only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from service_runner import API_KEY, REPO, start_service

from rlflow.data.tasks.base import build_task
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.data.tasks.files import write_task_files
from rlflow.models.presets import build_preset

pytestmark = [pytest.mark.full, pytest.mark.timeout(2400)]

MODEL_NAME = "Qwen/Qwen3-8B-Base"  # in the cookbook's registry, renderer role_colon
COOKBOOK_PYTHON = REPO / ".venv-cookbook" / "bin" / "python"
SFT_STEPS, RL_STEPS = 300, 30


def run(command: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> str:
    result = subprocess.run(command, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, " ".join(command) + "\n" + result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def warm_hub(tmp_path_factory) -> tuple[Path, Path]:
    """(HF_HOME with the stand-ins, the warm start's HF folder)."""
    out = tmp_path_factory.mktemp("cookbook_loops")
    run(["bash", "scripts/cookbook_venv.sh"], timeout=900)
    model = build_preset(out / "model", tokenizer_corpus(), preset="tiny", seed=0)
    write_task_files(build_task("chain_arith", digits=1, num_ops=3), out / "task", n_train=4000, n_val=64, seed=0)
    run([str(COOKBOOK_PYTHON), "scripts/cookbook_offline_hub.py", "--home", str(out / "hf_home"), "--model-name",
         MODEL_NAME, "--tokenizer-from", str(model), "--task", str(out / "task"), "--sft-out", str(out / "sft_data"),
         "--role-colon-model", str(out / "model_rc")], env={"PYTHONPATH": ""})
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # the recipe calls `python`
    run(["bash", "recipes/sft_tiny_cpu.sh", "data.max_length=320", "trainer.save_freq=-1", "trainer.test_freq=100"],
        env={"PATH": path, "MODEL": str(out / "model_rc"), "DATA": str(out / "sft_data"), "OUT": str(out / "sft"),
             "STEPS": str(SFT_STEPS), "SEED": "0"})
    return out / "hf_home", out / "sft" / "hf"


@pytest.fixture(scope="module")
def server(warm_hub, tmp_path_factory):
    _, warm = warm_hub
    yield from start_service(tmp_path_factory.mktemp("cookbook_service"), [
        "engine=fsdp2", "rollout=vllm", f"service.models={{{MODEL_NAME}:{warm}}}", "service.max_seq_len=1024"])


def run_loop(recipe: str, server, hub: Path, log_path: Path, *arguments: str) -> list[dict]:
    """``python -m tinker_cookbook.recipes.<recipe>`` in the cookbook venv, offline; its metrics.jsonl records."""
    env = {"TINKER_API_KEY": API_KEY, "HF_HOME": str(hub), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    run([str(COOKBOOK_PYTHON), "-m", f"tinker_cookbook.recipes.{recipe}", f"base_url={server.url}",
         f"model_name={MODEL_NAME}", f"log_path={log_path}", *arguments], env=env, timeout=1500)
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def test_cookbook_sl_loop_runs_unmodified_and_its_loss_falls(server, warm_hub, tmp_path):
    records = run_loop("sl_loop", server, warm_hub[0], tmp_path / "sl_loop", "batch_size=16", "max_steps=12",
                       "lora_rank=8", "learning_rate=1e-3", "max_length=512", "save_every=5")
    nll = [record["train_mean_nll"] for record in records if "train_mean_nll" in record]
    print(f"sl_loop train_mean_nll by step: {[round(value, 3) for value in nll]}")
    assert len(nll) == 12 and sum(nll[-3:]) / 3 < 0.8 * sum(nll[:3]) / 3
    checkpoints = [json.loads(line) for line in (tmp_path / "sl_loop" / "checkpoints.jsonl").read_text().splitlines()]
    assert checkpoints and all(entry["state_path"].startswith("tinker://") for entry in checkpoints)


def test_cookbook_rl_loop_runs_unmodified_and_its_reward_rises(server, warm_hub, tmp_path):
    records = run_loop("rl_loop", server, warm_hub[0], tmp_path / "rl_loop", "batch_size=16", "group_size=8",
                       f"max_steps={RL_STEPS}", "lora_rank=8", "learning_rate=2e-3", "max_tokens=48", "save_every=0")
    rewards = [record["reward/total"] for record in records if "reward/total" in record]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(f"rl_loop reward/total by step: {[round(value, 3) for value in rewards]}; first 10 {first:.3f}, "
          f"last 10 {last:.3f}")
    assert len(rewards) == RL_STEPS and first > 0 and last >= first + 0.05
