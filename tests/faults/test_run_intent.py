"""What the user asked of the run folder is never silently dropped: ``resume_from_path`` without
``resume_mode=path``, an export folder that would hit the run folder, and a checkpoint of another model
are refused in one line before Ray starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from one_line_errors import cli_refusal, one_line_error

from rlflow.errors import CheckpointError
from rlflow.trainer.checkpoint import CheckpointManager
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config
from rlflow.trainer.run_folder import RunLock, open_run_folder


@pytest.mark.parametrize("overrides, message", [
    (["trainer.default_local_dir=/r", "trainer.export_hf_dir=/r"],
     "config key 'trainer.export_hf_dir': /r is the run folder trainer.default_local_dir=/r"),
    (["trainer.default_local_dir=/r/run", "trainer.export_hf_dir=/r"],
     "config key 'trainer.export_hf_dir': /r is a folder holding the run folder"),
    (["trainer.default_local_dir=/r", "trainer.export_hf_dir=/r/global_step_2/hf"],
     "config key 'trainer.export_hf_dir': /r/global_step_2/hf is inside the checkpoint /r/global_step_2"),
    (["trainer.export_hf_dir=/e", "trainer.export_lora_adapter_dir=/e"],
     "config key 'trainer.export_lora_adapter_dir': /e is also trainer.export_hf_dir"),
])
def test_an_export_folder_that_would_hit_the_run_folder_is_refused(overrides, message):
    assert one_line_error(compose_ppo_config, overrides).startswith(message)


def test_exports_in_subfolders_of_the_run_folder_stay_allowed():
    config = compose_sft_config(["trainer.default_local_dir=/r", "trainer.export_hf_dir=/r/hf",
                                 "trainer.export_lora_adapter_dir=/r/adapter"])
    assert config.trainer.export_lora_adapter_dir == "/r/adapter"


def _model(folder: Path, hidden_size: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": hidden_size, "num_hidden_layers": 2}))
    return folder


def test_a_checkpoint_of_another_architecture_is_refused_at_start_naming_the_keys(tmp_path):
    overrides = [f"trainer.default_local_dir={tmp_path / 'run'}", "model=hf", f"model.path={_model(tmp_path / 'm', 64)}"]
    manager = CheckpointManager(tmp_path / "run")
    manager.save(1, {"global_step": 1}, lambda folder: _model(folder / "actor" / "hf_config", 32))
    with pytest.raises(CheckpointError, match=r"global_step_1 holds another model than model.path .*\(hidden_size: "
                                              r"checkpoint 32 vs model 64\); it cannot be loaded") as error:
        open_run_folder(compose_ppo_config([*overrides, "trainer.resume_mode=force"]))
    assert "\n" not in str(error.value)
    RunLock(tmp_path / "run").acquire().release()  # the refused run let go of the lock
    open_run_folder(compose_ppo_config([*overrides, "trainer.resume_mode=disable"])).release()


def test_the_cli_refuses_resume_from_path_without_its_mode_before_ray(tmp_path):
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", f"trainer.resume_from_path={tmp_path / 'global_step_3'}",
                        f"trainer.ray_temp_dir={tmp_path / 'ray'}", f"trainer.default_local_dir={tmp_path / 'run'}"],
                       ray_dir=tmp_path / "ray")
    assert line.startswith("config key 'trainer.resume_from_path': set, but trainer.resume_mode=auto does not read it"), line
    assert not (tmp_path / "run").exists()


def test_a_run_that_wrote_nothing_leaves_no_folder_behind(tmp_path):
    """The run folder and the export folder's parent, created by the start-up checks, go again when the run ends
    before writing anything; a folder that existed before, or holds what the run wrote, stays."""
    overrides = [f"trainer.default_local_dir={tmp_path / 'new' / 'run'}", f"trainer.export_hf_dir={tmp_path / 'exports' / 'hf'}"]
    open_run_folder(compose_ppo_config(overrides)).release()
    assert sorted(path.name for path in tmp_path.iterdir()) == []
    lock = open_run_folder(compose_ppo_config(overrides))
    (tmp_path / "new" / "run" / "metrics.jsonl").write_text("{}\n")
    lock.release()
    assert sorted(path.name for path in (tmp_path / "new" / "run").iterdir()) == [".rlflow.lock", "metrics.jsonl"]
    existing = tmp_path / "existing"
    existing.mkdir()
    open_run_folder(compose_ppo_config([f"trainer.default_local_dir={existing}"])).release()
    assert existing.is_dir()
