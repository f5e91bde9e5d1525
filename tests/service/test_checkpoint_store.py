"""``CheckpointStore``: the REST client's training runs and checkpoints, read from disk for one account at a time.

The JSON each operation returns is validated by the SDK's own pydantic types (``TrainingRun``, ``Checkpoint``).
A fresh store over the same folder (a restarted service) lists the same; deletes remove only the checkpoint.
"""

from __future__ import annotations

import time

import pytest
from tinker import types

from rlflow.errors import UserError
from rlflow.service.catalogue import CheckpointFolders, LoraShape, UnknownModelError
from rlflow.service.checkpoint_store import TTL_RANGE_S, CheckpointStore

MINE, THEIRS = "acct-mine", "acct-theirs"


@pytest.fixture
def folders(tmp_path) -> CheckpointFolders:
    folders = CheckpointFolders(tmp_path)
    for model_id, account in (("s0-a:train:0", MINE), ("s1-b:train:0", THEIRS), ("s0-a:train:1", MINE)):
        folders.write_record(model_id, "tiny", LoraShape(8, ("attention",)), account)
        for kind, name in (("weights", "step-1"), ("sampler_weights", "step-1")):
            (folders.folder(model_id, kind, name)).mkdir(parents=True)
            (folders.folder(model_id, kind, name) / "adapter.safetensors").write_bytes(b"x" * 10)
        time.sleep(0.01)  # distinct modification times: the newest run lists first
    return folders


def test_runs_and_checkpoints_list_for_their_account_as_the_sdk_types(folders):
    store = CheckpointStore(folders)
    assert store.run_ids(MINE) == ["s0-a:train:1", "s0-a:train:0"] and store.run_ids(THEIRS) == ["s1-b:train:0"]
    run = types.TrainingRun.model_validate(store.training_run("s0-a:train:0", MINE))
    assert (run.base_model, run.lora_rank, run.model_owner) == ("tiny", 8, MINE)
    assert run.last_checkpoint.tinker_path == "tinker://s0-a:train:0/weights/step-1"
    listed = [types.Checkpoint.model_validate(c.as_json(folders)) for c in store.checkpoints("s0-a:train:0", MINE)]
    assert sorted((c.checkpoint_id, c.checkpoint_type, c.size_bytes) for c in listed) == [
        ("sampler_weights/step-1", "sampler", 10), ("weights/step-1", "training", 10)]
    with pytest.raises(UnknownModelError):
        store.checkpoints("s1-b:train:0", MINE)
    assert CheckpointStore(CheckpointFolders(folders.root)).run_ids(MINE) == store.run_ids(MINE)  # after a restart


def test_delete_removes_the_checkpoint_only_and_only_for_its_account(folders):
    store = CheckpointStore(folders)
    users_file = folders.model_dir("s0-a:train:0") / "notes.txt"
    users_file.write_text("not rlflow's")
    with pytest.raises(UnknownModelError):
        store.delete("s0-a:train:0", "weights", "step-1", THEIRS)
    store.delete("s0-a:train:0", "weights", "step-1", MINE)
    assert not folders.folder("s0-a:train:0", "weights", "step-1").exists()
    assert folders.folder("s0-a:train:0", "sampler_weights", "step-1").is_dir() and users_file.read_text() == "not rlflow's"
    with pytest.raises(UnknownModelError):
        store.delete("s0-a:train:0", "weights", "step-1", MINE)
    with pytest.raises(UnknownModelError):
        store.delete("s0-a:train:0", "../weights", "step-1", MINE)


def test_a_published_checkpoint_resolves_for_every_account_until_unpublished(folders):
    store, path = CheckpointStore(folders), "tinker://s0-a:train:0/sampler_weights/step-1"
    with pytest.raises(UnknownModelError):
        folders.resolve(path, "sampler_weights", THEIRS)
    store.set_public("s0-a:train:0", "sampler_weights", "step-1", MINE, public=True)
    assert folders.resolve(path, "sampler_weights", THEIRS)[0] == "s0-a:train:0"
    with pytest.raises(UnknownModelError):  # readable, not theirs to change
        store.delete("s0-a:train:0", "sampler_weights", "step-1", THEIRS)
    store.set_public("s0-a:train:0", "sampler_weights", "step-1", MINE, public=False)
    with pytest.raises(UnknownModelError):
        folders.resolve(path, "sampler_weights", THEIRS)


def test_an_expired_checkpoint_stops_resolving_and_is_deleted_at_the_next_listing(folders, monkeypatch):
    store, path = CheckpointStore(folders), "tinker://s0-a:train:0/weights/step-1"
    with pytest.raises(UserError, match="ttl_seconds must be"):
        store.set_ttl("s0-a:train:0", "weights", "step-1", MINE, TTL_RANGE_S[0] - 1)
    store.set_ttl("s0-a:train:0", "weights", "step-1", MINE, TTL_RANGE_S[0])
    listed = {c.name: types.Checkpoint.model_validate(c.as_json(folders)) for c in store.checkpoints("s0-a:train:0", MINE)
              if c.kind == "weights"}
    assert listed["step-1"].expires_at is not None
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + TTL_RANGE_S[0] + 1)
    with pytest.raises(UnknownModelError):
        folders.resolve(path, "weights", MINE)
    assert [c.kind for c in store.checkpoints("s0-a:train:0", MINE)] == ["sampler_weights"]
    assert not folders.folder("s0-a:train:0", "weights", "step-1").exists()
