"""Every recipe under ``recipes/`` is a command line that ``main_ppo`` / ``main_sft`` accepts.

Each recipe script runs with a stand-in ``python`` first on ``PATH`` that records its arguments
instead of training; the recorded overrides then go through the same Hydra composition and
config validation the entry point runs. A renamed key, a wrong type or a missing group option in
a recipe fails here. Training through the CPU recipes is covered by the demo tests
(``tests/demo``), which run ``sft_tiny_cpu.sh`` and ``grpo_tiny_cpu.sh``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config

REPO = Path(__file__).resolve().parents[2]
RECORDING_PYTHON = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$RECIPE_ARGV_FILE"
"""
# Environment a user sets for the recipes that have no local defaults (GPU and multi-node ones).
RECIPE_ENV = {"MODEL": "/models/Qwen2.5-0.5B-Instruct", "DATA": "/data/gsm8k"}
ENTRY_POINTS = {"rlflow.trainer.main_ppo": compose_ppo_config, "rlflow.trainer.main_sft": compose_sft_config}
# demo.sh and demo_agent.sh chain the recipes below; sft_engine_smoke.sh loops torchrun over engines (the same job as
# tests/trainer/test_sft_parity.py).
NOT_ONE_COMMAND_LINE = {"demo.sh", "demo_agent.sh", "sft_engine_smoke.sh"}
TRAINING_RECIPES = sorted(path.name for path in (REPO / "recipes").glob("*.sh") if path.name not in NOT_ONE_COMMAND_LINE)


def recorded_command(recipe: str, tmp_path: Path, extra: list[str]) -> list[str]:
    """The arguments ``recipes/<recipe>`` passes to python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python"
    shim.write_text(RECORDING_PYTHON)
    shim.chmod(0o755)
    argv_file = tmp_path / "argv.txt"
    env = {**os.environ, **RECIPE_ENV, "RECIPE_ARGV_FILE": str(argv_file), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(REPO / "recipes" / recipe), *extra], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return argv_file.read_text().splitlines()


def compose_and_validate(argv: list[str]):
    assert argv[0] == "-m" and argv[1] in ENTRY_POINTS, f"not an rlflow entry point: {argv[:2]}"
    return argv[1], ENTRY_POINTS[argv[1]](argv[2:])


@pytest.mark.parametrize("recipe", TRAINING_RECIPES)
def test_recipe_is_a_valid_entry_point_command_line(recipe, tmp_path):
    entry, cfg = compose_and_validate(recorded_command(recipe, tmp_path, []))
    if entry.endswith("main_ppo"):
        assert cfg.algorithm.adv_estimator, recipe


@pytest.mark.parametrize(("recipe", "estimator", "uses_critic"), [
    ("grpo_tiny_cpu.sh", "grpo", False),
    ("ppo_tiny_cpu.sh", "gae", True),
    ("rloo_tiny_cpu.sh", "rloo", False),
    ("reinforce_pp_tiny_cpu.sh", "reinforce_plus_plus", False),
])
def test_cpu_recipes_pick_their_algorithm_and_pass_overrides_through(recipe, estimator, uses_critic, tmp_path):
    _, cfg = compose_and_validate(recorded_command(recipe, tmp_path, ["trainer.total_training_steps=3"]))
    assert cfg.algorithm.adv_estimator == estimator
    assert (cfg.algorithm.adv_estimator == "gae") == uses_critic
    assert cfg.actor.engine.name == "fsdp2" and cfg.rollout.name == "vllm"
    assert cfg.trainer.total_training_steps == 3, "extra overrides must reach the entry point"


def test_a_bad_override_through_a_recipe_is_rejected(tmp_path):
    from rlflow.config import ConfigError

    argv = recorded_command("grpo_tiny_cpu.sh", tmp_path, ["trainer.total_training_steps=many"])
    with pytest.raises(ConfigError, match="total_training_steps"):
        compose_and_validate(argv)
