"""Checkpoints that never lose a step: fsync before rename, fallback past a corrupt newest one, a full disk,
safe pruning, and the trackers' resume (tensorboard purge, wandb without replays)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlflow.engines.common.checkpoint import checkpointing
from rlflow.errors import CheckpointError
from rlflow.trainer import checkpoint as checkpoint_module
from rlflow.trainer.checkpoint import DRIVER_STATE, LATEST_FILE, CheckpointManager
from rlflow.trainer.checkpoint_manifest import MANIFEST_FILE
from rlflow.utils import durable

REPO = Path(__file__).resolve().parents[2]


def write_engine(folder: Path, size: int = 64) -> None:
    """A stand-in for a role's engine checkpoint: a weights file and its meta."""
    (folder / "actor" / "model_optim").mkdir(parents=True)
    (folder / "actor" / "model_optim" / "__0_0.distcp").write_bytes(os.urandom(size))
    (folder / "actor" / checkpointing.META_FILE).write_text("{}")


def save(manager: CheckpointManager, step: int) -> Path:
    return manager.save(step, {"global_step": step, "payload": torch.arange(10)}, write_engine)


def test_pruning_keeps_the_newest_and_never_touches_a_newer_folder(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (1, 2, 3):
        save(manager, step)
    assert manager.complete_steps() == [2, 3]
    save(CheckpointManager(tmp_path, max_to_keep=1), 4)  # a later run keeps one
    assert manager.complete_steps() == [4]

    # a folder of an abandoned later timeline (a resume fell back past it) is never pruned in place of the new one
    save(CheckpointManager(tmp_path), 9)
    save(CheckpointManager(tmp_path, max_to_keep=1), 5)
    assert manager.complete_steps() == [5, 9]
    assert (tmp_path / LATEST_FILE).read_text() == "5"


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    for step in (1, 2, 3):
        save(manager, step)
    assert manager.latest() == manager.step_dir(3)

    driver_state = manager.step_dir(3) / DRIVER_STATE  # truncated driver state
    driver_state.write_bytes(driver_state.read_bytes()[:50])
    shard = manager.step_dir(2) / "actor" / "model_optim" / "__0_0.distcp"  # an engine shard cut short
    shard.write_bytes(shard.read_bytes()[:10])
    caplog.clear()
    assert manager.resolve("auto", None) == manager.step_dir(1)
    assert "global_step_3 cannot be loaded (" in caplog.text and "global_step_2 cannot be loaded (" in caplog.text
    assert "actor/model_optim/__0_0.distcp has 10 bytes, 64 were written" in caplog.text

    os.remove(manager.step_dir(1) / "actor" / checkpointing.META_FILE)  # an engine file missing
    with pytest.raises(CheckpointError, match="no loadable checkpoint in"):
        manager.resolve("auto", None)
    with pytest.raises(CheckpointError, match=r"resume_from_path: .*global_step_1 cannot be loaded: actor/engine_meta.json is missing"):
        manager.resolve("path", str(manager.step_dir(1)))


def test_a_checkpoint_without_a_manifest_is_checked_by_its_driver_state(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    save(manager, 2)
    for step in (1, 2):
        os.remove(manager.step_dir(step) / MANIFEST_FILE)
    (manager.step_dir(2) / DRIVER_STATE).write_bytes(b"not a torch file")
    assert manager.latest() == manager.step_dir(1)


def _record_fsyncs(monkeypatch) -> list[str]:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    return synced


def test_every_file_and_folder_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    synced = _record_fsyncs(monkeypatch)
    renames: list[int] = []
    real_rename = Path.rename
    monkeypatch.setattr(Path, "rename", lambda self, target: (renames.append(len(synced)), real_rename(self, target))[1])
    save(CheckpointManager(tmp_path), 7)
    partial = tmp_path / "global_step_7.partial"
    before_rename = set(synced[: renames[0]])
    for name in (DRIVER_STATE, MANIFEST_FILE, "actor/model_optim/__0_0.distcp", "actor/engine_meta.json", "actor", ""):
        assert str(partial / name).rstrip("/") in before_rename, name
    after = synced[renames[0]:]
    assert str(tmp_path) in after and str(tmp_path / (LATEST_FILE + ".tmp")) in after


def test_the_engine_checkpoint_folder_is_fsynced_before_its_rename(tmp_path, monkeypatch):
    synced = _record_fsyncs(monkeypatch)
    with checkpointing.atomic_checkpoint_dir(tmp_path / "actor", group=None) as folder:
        (folder / "rng_rank0.pt").write_bytes(b"x")
    assert {str(tmp_path / "actor.tmp" / "rng_rank0.pt"), str(tmp_path / "actor.tmp"), str(tmp_path)} <= set(synced)
    assert (tmp_path / "actor" / "rng_rank0.pt").is_file()


def test_a_failed_save_removes_its_partial_folder_and_keeps_the_previous(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)

    def broken_workers(folder: Path) -> None:
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError, match="worker died"):
        manager.save(2, {"global_step": 2}, broken_workers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", LATEST_FILE]
    assert manager.latest() == manager.step_dir(1)


def test_a_full_disk_during_a_save_is_one_clear_error_and_the_previous_checkpoint_stays(tmp_path):
    """RLIMIT_FSIZE in a child process: writes past 1 MiB fail with EFBIG, as on a full disk."""
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from pathlib import Path
        import torch
        from rlflow.errors import CheckpointError
        from rlflow.trainer.checkpoint import CheckpointManager
        manager = CheckpointManager({str(tmp_path)!r})
        manager.save(1, {{"global_step": 1}}, lambda folder: (folder / "w.bin").write_bytes(b"0" * 1000))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            manager.save(2, {{"global_step": 2}}, lambda folder: (folder / "w.bin").write_bytes(b"0" * (2 << 20)))
        except CheckpointError as error:
            print("ERROR", error)
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    line = result.stdout.strip()
    assert line.startswith("ERROR saving checkpoint global_step_2 in") and "File too large" in line, line
    assert f"the previous checkpoint {tmp_path / 'global_step_1'} is intact" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", LATEST_FILE]
    assert CheckpointManager(tmp_path).latest() == tmp_path / "global_step_1"


def test_disk_full_is_recognised_in_a_worker_error_text(tmp_path):
    manager = CheckpointManager(tmp_path)
    error = manager._save_failed(3, RuntimeError("rank 0 save_checkpoint: OSError: [Errno 28] No space left on device"))
    assert isinstance(error, CheckpointError) and "No space left on device" in str(error)
    assert "no earlier checkpoint exists" in str(error)
    other = RuntimeError("boom")
    assert manager._save_failed(3, other) is other
    assert checkpoint_module.RESUME_MODES == ("auto", "force", "disable", "path")


def test_tensorboard_resume_purges_the_replayed_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlflow.observability.tracking import Tracking

    with Tracking("p", "e", ["tensorboard"], output_dir=tmp_path) as first:
        for step in (1, 2, 3, 4):
            first.log({"loss": float(step)}, step)  # the run dies after logging step 4; its checkpoint is step 2
    with Tracking("p", "e", ["tensorboard"], output_dir=tmp_path) as resumed:
        for step in (3, 4, 5):
            resumed.log({"loss": 10.0 * step}, step)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]


def test_wandb_resume_continues_the_run_and_skips_steps_it_holds(tmp_path, monkeypatch):
    from rlflow.observability.tracking import Tracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    with Tracking("rlflow-test", "exp", ["wandb"], output_dir=tmp_path) as first:
        for step in (1, 2, 3):
            first.log({"loss": float(step)}, step)
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    sent: list[int] = []
    with Tracking("rlflow-test", "exp", ["wandb"], output_dir=tmp_path) as resumed:
        tracker = resumed.trackers["wandb"]
        assert tracker.wandb_run is None  # the run starts at the first logged step
        start = tracker._start

        def start_and_record(first_step: int) -> None:
            start(first_step)
            log = tracker.wandb_run.log
            monkeypatch.setattr(tracker.wandb_run, "log", lambda metrics, step: (sent.append(step), log(metrics, step=step)))

        tracker._start = start_and_record
        for step in (3, 4):  # resumed from a checkpoint at step 2; step 3 is already in the run
            resumed.log({"loss": float(step)}, step)
    assert (tmp_path / "wandb_run_id").read_text().strip() == run_id, "a resumed run continues the same wandb run"
    assert sent == [4] and (tmp_path / "wandb_last_step").read_text().strip() == "4"
    # wandb names a run's folder offline-run-<time>-<id>, adding -1 when both sessions start in the same second
    run_folders = [p for p in (tmp_path / "wandb").iterdir() if re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", p.name)]
    assert len(run_folders) == 2
    with Tracking("rlflow-test", "exp", ["wandb"], output_dir=tmp_path) as restarted:
        restarted.log({"loss": 0.5}, 1)  # a run started over (step 1) is a new wandb run
    assert (tmp_path / "wandb_run_id").read_text().strip() != run_id
