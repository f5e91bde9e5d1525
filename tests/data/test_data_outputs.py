"""``rlflow-data`` never replaces a file it did not write, replaces its own only with ``--overwrite``, and checks
``--out`` before any work; a refused run leaves the user's file byte for byte as it was."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from one_line_errors import cli_refusal

from rlflow.data.cli import main
from rlflow.data.outputs import OUTPUTS_MARKER

TASK = ["task", "addition", "--train", "4", "--val", "2", "--seed", "0"]


def _users_file(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"mine": [1, 2, 3]}), path)
    return path.read_bytes()


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_a_users_file_in_out_is_never_replaced(tmp_path, capsys):
    before = _users_file(tmp_path / "out" / "val.parquet")
    assert main([*TASK, "--out", str(tmp_path / "out"), "--overwrite"]) == 2
    assert f"{tmp_path / 'out' / 'val.parquet'} exists and rlflow-data did not write it" in _error(capsys)
    assert (tmp_path / "out" / "val.parquet").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["val.parquet"], "nothing else was written either"


def test_its_own_output_is_replaced_only_with_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*TASK, "--out", str(out)]) == 0
    assert (out / OUTPUTS_MARKER).is_file()
    first = (out / "train.parquet").read_bytes()
    assert main([*TASK[:-1], "1", "--out", str(out)]) == 2
    assert "was written by an earlier rlflow-data run; pass --overwrite" in _error(capsys)
    assert (out / "train.parquet").read_bytes() == first
    assert main([*TASK[:-1], "1", "--out", str(out), "--overwrite"]) == 0
    assert (out / "train.parquet").read_bytes() != first


@pytest.mark.parametrize("make_out, words", [
    (lambda tmp: (tmp / "a_file").write_text("x") and tmp / "a_file", "is a file; name a folder"),
    (lambda tmp: (tmp / "a_file").write_text("x") and tmp / "a_file" / "out", "is a file, so the path cannot be created"),
])
def test_a_bad_out_is_one_line_before_any_work(tmp_path, capsys, make_out, words):
    assert main([*TASK, "--out", str(make_out(tmp_path))]) == 2
    assert words in _error(capsys)


def test_the_converter_command_keeps_a_users_train_parquet_byte_identical(tmp_path):
    source = tmp_path / "src" / "train.jsonl"
    source.parent.mkdir()
    source.write_text('{"question": "1+1?", "answer": "2 #### 2"}\n')
    target = tmp_path / "out" / "train.parquet"
    before = _users_file(target)
    line = cli_refusal(["-m", "rlflow.data.cli", "gsm8k", "--src", str(source), "--out", str(tmp_path / "out")])
    assert line.startswith(f"--out {tmp_path / 'out'}: {target} exists and rlflow-data did not write it"), line
    assert target.read_bytes() == before
