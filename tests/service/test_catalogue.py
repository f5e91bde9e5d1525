"""The service's training-client records: written and read back, a damaged one is one line naming the file, and
another account's paths and futures do not exist to an account (``rlflow.service.accounts``)."""

from __future__ import annotations

import asyncio

import pytest

from rlflow.service.accounts import account_of_key
from rlflow.service.catalogue import MODEL_RECORD, CheckpointFolders, LoraShape, UnknownModelError
from rlflow.service.futures import FutureStore, Outcome, UnknownFutureError
from rlflow.utils.text_files import FileFormatError


def test_a_record_reads_back_what_was_written(tmp_path):
    folders = CheckpointFolders(tmp_path)
    folders.write_record("run:1", "tiny", LoraShape(8, ("attention", "mlp")), "acct-a")
    assert folders.read_record("run:1") == ("tiny", LoraShape(8, ("attention", "mlp")))
    with pytest.raises(UnknownModelError, match="was not created on this server"):
        folders.read_record("run:2")


@pytest.mark.parametrize("text,words", [
    ('{"model_id": "run:1", "base_model": "ti', "not valid JSON at line 1"),
    ('{"model_id": "run:1", "base_model": "tiny"}', "not the record this server writes"),
    ('[1, 2]', "not the record this server writes"),
])
def test_a_damaged_record_is_one_line_naming_the_file(tmp_path, text, words):
    folders = CheckpointFolders(tmp_path)
    folders.write_record("run:1", "tiny", LoraShape(8, ("attention",)), "acct-a")
    record = folders.model_dir("run:1") / MODEL_RECORD
    record.write_text(text)
    with pytest.raises(FileFormatError) as error:
        folders.read_record("run:1")
    assert str(error.value).startswith(f"training client record {record}: ") and words in str(error.value)


def test_a_path_resolves_for_its_own_account_only_and_the_key_is_never_written(tmp_path):
    first, second = account_of_key("tml-first"), account_of_key("tml-second")
    assert first != second and "tml-first" not in first
    folders = CheckpointFolders(tmp_path)
    folders.write_record("s0:train:0", "tiny", LoraShape(8, ("attention",)), first)
    folders.folder("s0:train:0", "weights", "ckpt").mkdir(parents=True)
    path = folders.path("s0:train:0", "weights", "ckpt")
    assert folders.resolve(path, "weights", first) == ("s0:train:0", folders.folder("s0:train:0", "weights", "ckpt"))
    with pytest.raises(UnknownModelError, match="does not exist on this server"):
        folders.resolve(path, "weights", second)
    assert "tml-first" not in (folders.model_dir("s0:train:0") / MODEL_RECORD).read_text()
    (folders.model_dir("s0:train:0") / MODEL_RECORD).write_text('{"model_id": "s0:train:0", "base_model": "tiny"}')
    with pytest.raises(UnknownModelError):  # a record without an account belongs to none
        folders.resolve(path, "weights", first)


def test_a_future_is_retrieved_by_its_own_account_only():
    async def scenario() -> None:
        futures = FutureStore(poll_wait_s=0.1)
        request_id = futures.create("acct-a")
        futures.finish(request_id, Outcome(payload={"ok": True}))
        with pytest.raises(UnknownFutureError):
            await futures.retrieve(request_id, "acct-b")
        assert (await futures.retrieve(request_id, "acct-a")).payload == {"ok": True}

    asyncio.run(scenario())
