"""The run folder's start-up checks: the lock, writability, the export folder guard, the resume fingerprint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlflow.engines.common.checkpoint.hf_export import EXPORT_MARKER, write_hf_folder
from rlflow.errors import CheckpointError, UserError
from rlflow.trainer.checkpoint import CheckpointManager
from rlflow.trainer.fingerprint import DATA_CONTENT_KEY, fingerprint_differences, is_free
from rlflow.trainer.run_folder import LOCK_FILE, RunFolderError, RunLock, check_export_dir, check_run_folder, open_run_folder

REPO = Path(__file__).resolve().parents[2]


def _hold_lock_in_a_process(folder: Path) -> subprocess.Popen:
    """Another process that takes the run lock and sleeps (prints 'locked' once it holds it)."""
    code = textwrap.dedent(f"""
        import sys, time
        from rlflow.trainer.run_folder import RunLock
        RunLock({str(folder)!r}).acquire()
        print("locked", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_run_is_refused_naming_pid_and_host_and_a_killed_holder_blocks_nothing(tmp_path):
    holder = _hold_lock_in_a_process(tmp_path)
    try:
        with pytest.raises(RunFolderError) as refused:
            RunLock(tmp_path).acquire()
        message = str(refused.value)
        assert f"pid {holder.pid}" in message and socket.gethostname() in message and str(tmp_path) in message
        assert "\n" not in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with RunLock(tmp_path).acquire():  # the OS dropped the dead holder's lock: its own resume may start
        assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()
    RunLock(tmp_path).acquire().release()  # released on exit: the next run takes it again


def _config(tmp_path: Path, *overrides: str):
    from rlflow.trainer.entry_points import compose_ppo_config

    data = tmp_path / "train.jsonl"
    if not data.exists():
        data.write_text('{"prompt": "1+1", "data_source": "x"}\n')
    return compose_ppo_config([f"data.train_files=[{data}]", f"trainer.default_local_dir={tmp_path / 'run'}", *overrides])


def test_an_unwritable_run_folder_is_one_line_before_anything_starts(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(RunFolderError, match=r"^config key 'trainer.default_local_dir': .*a_file/run is not writable "
                                             r"\(Not a directory\)") as error:
        open_run_folder(_config(tmp_path, f"trainer.default_local_dir={blocker / 'run'}"))
    assert "\n" not in str(error.value)


def test_the_export_folder_is_replaced_only_when_rlflow_wrote_it(tmp_path):
    user_folder = tmp_path / "mine"
    user_folder.mkdir()
    (user_folder / "notes.txt").write_text("precious")
    with pytest.raises(RunFolderError, match=r"trainer.export_hf_dir.*mine holds files rlflow did not export"):
        open_run_folder(_config(tmp_path, f"trainer.export_hf_dir={user_folder}"))
    with pytest.raises(FileExistsError, match="not an rlflow export"):  # the writer refuses it too
        write_hf_folder(user_folder, [("w", torch.zeros(2))], tmp_path)
    assert (user_folder / "notes.txt").read_text() == "precious"

    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text("{}")
    export = write_hf_folder(tmp_path / "export", [("w", torch.zeros(2))], source)
    assert (export / EXPORT_MARKER).is_file() and (export / "config.json").is_file()
    check_export_dir(export)  # an rlflow export may be replaced
    write_hf_folder(export, [("w", torch.ones(2))], source)
    empty = tmp_path / "empty"
    empty.mkdir()
    write_hf_folder(empty, [("w", torch.ones(2))], source)
    assert (empty / "model.safetensors").is_file()


def test_the_cli_refuses_a_locked_folder_with_exit_2_and_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = _hold_lock_in_a_process(run_dir)
    try:
        result = subprocess.run([sys.executable, "-m", "rlflow.trainer.main_ppo", f"trainer.default_local_dir={run_dir}",
                                 f"trainer.ray_temp_dir={tmp_path / 'ray'}"],
                                cwd=REPO, capture_output=True, text=True, timeout=300)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [line for line in result.stderr.splitlines() if line.strip()][-1:]
    assert f"pid {holder.pid}" in errors[0]
    assert not (tmp_path / "ray").exists(), "Ray started although the folder was locked"


# ---------------------------------------------------------------------------------------- fingerprint
def test_free_and_math_keys():
    for key in ("trainer.total_training_steps", "trainer.logger", "trainer.save_freq", "trainer.n_procs_per_node",
                "trainer.placement", "trainer.experiment_name", "trainer.default_local_dir", "actor.engine.micro_batch_size",
                "engine.param_offload", "critic.engine.lr_scheduler.total_steps", "trainer.call_timeout_s",
                "trainer.allow_slow_half_precision"):
        assert is_free(key), key
    for key in ("actor.engine.optimizer.lr", "algorithm.adv_estimator", "data.train_batch_size", "rollout.temperature",
                "trainer.seed", "model.path", "actor.policy_loss.loss_mode", "engine.param_dtype", "a.new.key"):
        assert not is_free(key), key


def _save(manager: CheckpointManager, step: int) -> Path:
    return manager.save(step, {"global_step": step}, lambda folder: (folder / "actor").mkdir())


def test_resume_with_changed_math_is_refused_naming_the_keys_unless_forced(tmp_path, caplog):
    first = CheckpointManager.for_run(_config(tmp_path, "actor.engine.optimizer.lr=1e-3"))
    _save(first, 2)
    same_math = CheckpointManager.for_run(_config(tmp_path, "actor.engine.optimizer.lr=1e-3", "trainer.total_training_steps=9",
                                                  "trainer.logger=[jsonl]", "trainer.save_freq=3"))
    assert same_math.resolve("auto", None) == first.step_dir(2)

    changed = CheckpointManager.for_run(_config(tmp_path, "actor.engine.optimizer.lr=1e-4", "algorithm.adv_estimator=rloo"))
    with pytest.raises(CheckpointError) as refused:
        changed.resolve("auto", None)
    message = str(refused.value)
    assert "actor.engine.optimizer.lr (0.001 -> 0.0001)" in message and "algorithm.adv_estimator ('grpo' -> 'rloo')" in message
    assert "trainer.resume_mode=force" in message and "\n" not in message
    assert isinstance(refused.value, UserError)
    caplog.clear()
    assert changed.resolve("force", None) == first.step_dir(2)
    assert "actor.engine.optimizer.lr" in caplog.text


def test_changed_training_data_content_is_a_math_change(tmp_path):
    first = CheckpointManager.for_run(_config(tmp_path))
    _save(first, 1)
    (tmp_path / "train.jsonl").write_text('{"prompt": "2+2", "data_source": "x"}\n')
    differences = fingerprint_differences(first.fingerprint, CheckpointManager.for_run(_config(tmp_path)).fingerprint)
    assert len(differences) == 1 and differences[0].startswith(DATA_CONTENT_KEY)


def test_open_run_folder_checks_the_resume_before_ray(tmp_path):
    _save(CheckpointManager.for_run(_config(tmp_path, "rollout.temperature=0.7")), 1)
    with pytest.raises(CheckpointError, match=r"rollout.temperature \(0.7 -> 1.0\)"):
        open_run_folder(_config(tmp_path))
    RunLock(tmp_path / "run").acquire().release()  # the refused run let go of the lock
    open_run_folder(_config(tmp_path, "trainer.resume_mode=force")).release()


def _tree(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def test_the_validate_check_asks_the_same_questions_and_creates_nothing(tmp_path):
    """check_run_folder (--validate) passes a fresh folder without creating it, and refuses what open_run_folder refuses."""
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1", "data_source": "x"}\n')
    before = _tree(tmp_path)
    check_run_folder(_config(tmp_path, f"trainer.default_local_dir={tmp_path / 'new' / 'run'}"))
    assert _tree(tmp_path) == before
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(RunFolderError, match=r"^config key 'trainer.default_local_dir': .*a_file/run cannot be written: "
                                             r".*a_file is a file, so the path cannot be created"):
        check_run_folder(_config(tmp_path, f"trainer.default_local_dir={blocker / 'run'}"))
    user_folder = tmp_path / "mine"
    user_folder.mkdir()
    (user_folder / "notes.txt").write_text("precious")
    with pytest.raises(RunFolderError, match=r"trainer.export_hf_dir.*mine holds files rlflow did not export"):
        check_run_folder(_config(tmp_path, f"trainer.export_hf_dir={user_folder}"))


def test_the_validate_check_finds_a_live_run_and_takes_no_lock(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = _hold_lock_in_a_process(run)
    try:
        with pytest.raises(RunFolderError, match=f"in use by another run \\(pid {holder.pid}"):
            check_run_folder(_config(tmp_path))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    check_run_folder(_config(tmp_path))  # the holder is gone: the check passes
    with RunLock(run).acquire():  # and left no lock behind
        pass
