"""``--validate``: every pre-Ray check of a run, then the resolved config and exit 0, or one line per problem and exit 2;
no Ray, nothing written in the run folder. One command-line run (main_ppo); the other drivers' preflights in-process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from conftest import REPO, base_overrides
from rlflow.errors import UserError
from rlflow.trainer.entry_points import PPO_ENTRY, SFT_ENTRY


def test_main_ppo_validate_prints_the_resolved_config_and_creates_no_run_folder(tiny_model, addition_data, tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "rlflow.trainer.main_ppo", *base_overrides(tiny_model, addition_data, run_dir),
                             "--validate"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load(result.stdout)
    assert config["model"]["path"] == str(tiny_model) and config["trainer"]["default_local_dir"] == str(run_dir)
    # the trainer's derived values are filled in: 64 prompts / 4 per step x (4 / 2) mini-batches
    assert config["actor"]["engine"]["lr_scheduler"]["total_steps"] == 32
    assert "config valid" in result.stderr and "Started a local Ray" not in result.stderr
    assert not run_dir.exists()


@pytest.mark.parametrize("extra, named", [
    (["actor.ppo_mini_batch_size=3"], "actor.ppo_mini_batch_size"),  # a trainer check: mini-batches must divide
    (["data.max_prompt_length=4", "data.truncation=error"], "max_prompt_length"),  # a data check
])
def test_ppo_preflight_runs_the_trainers_checks(tiny_model, addition_data, tmp_path, extra, named):
    config = PPO_ENTRY.compose(base_overrides(tiny_model, addition_data, tmp_path / "run") + extra)
    with pytest.raises(UserError, match=named):
        PPO_ENTRY.preflight(config)
    assert not (tmp_path / "run").exists()


def test_sft_preflight_checks_the_data_and_the_run_folder(tiny_model, addition_data, tmp_path):
    overrides = [f"model.path={tiny_model}", "model.preset=null", f"data.train_files=[{addition_data / 'sft_train.parquet'}]",
                 f"data.val_files=[{addition_data / 'sft_val.parquet'}]", "data.train_batch_size=8",
                 f"trainer.default_local_dir={tmp_path / 'run'}"]
    SFT_ENTRY.preflight(SFT_ENTRY.compose(overrides))
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match="nope.parquet"):
        SFT_ENTRY.preflight(SFT_ENTRY.compose(overrides + [f"data.train_files=[{tmp_path / 'nope.parquet'}]"]))
