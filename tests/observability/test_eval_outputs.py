"""``rlflow-eval`` checks where it will write its responses before it generates anything."""

from __future__ import annotations

from rlflow.observability.evaluate import main


def test_a_responses_path_that_cannot_be_written_is_one_line_before_any_generation(tmp_path, capsys):
    (tmp_path / "a_file").write_text("mine")
    # --model and --data do not exist: were they read first, the error would name them
    status = main(["--model", str(tmp_path / "no_model"), "--data", str(tmp_path / "no_data.parquet"),
                   "--responses", str(tmp_path / "a_file" / "responses.jsonl")])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: --responses {tmp_path / 'a_file' / 'responses.jsonl'}: {tmp_path / 'a_file'} is a file")
    assert (tmp_path / "a_file").read_text() == "mine"
