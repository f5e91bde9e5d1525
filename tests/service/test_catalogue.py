"""The service's training-client records: written and read back, and a damaged one is one line naming the file."""

from __future__ import annotations

import pytest

from rlflow.service.catalogue import MODEL_RECORD, CheckpointFolders, LoraShape, UnknownModelError
from rlflow.utils.text_files import FileFormatError


def test_a_record_reads_back_what_was_written(tmp_path):
    folders = CheckpointFolders(tmp_path)
    folders.write_record("run:1", "tiny", LoraShape(8, ("attention", "mlp")))
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
    folders.write_record("run:1", "tiny", LoraShape(8, ("attention",)))
    record = folders.model_dir("run:1") / MODEL_RECORD
    record.write_text(text)
    with pytest.raises(FileFormatError) as error:
        folders.read_record("run:1")
    assert str(error.value).startswith(f"training client record {record}: ") and words in str(error.value)
