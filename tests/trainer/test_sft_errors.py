"""Bad SFT data stops ``main_sft`` with one clear line on stderr and exit status 2, before any worker starts.

The data cases run ``main_sft``'s entry in this process (same Hydra parsing and error handling,
no interpreter start-up per case); one case runs the real command line.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from sft_testlib import run_main_sft, sft_assets

from rlflow.trainer import main_sft

GOOD = [{"role": "user", "content": "What is 1+2?"}, {"role": "assistant", "content": "1+2=3\n#### 3"}]

CASES = {
    # name: (rows of the jsonl file, extra overrides, what the error line must say)
    "bad_row": ([{"messages": GOOD}, {"messages": "1+2=3"}], [], r"row 1, field 'messages': must be a non-empty list"),
    "no_assistant_turn": ([{"messages": GOOD}, {"messages": GOOD[:1]}], [], r"row 1, field 'messages': .*no assistant turn"),
    "overlong_sample": ([{"messages": GOOD}], ["data.max_length=8", "data.truncation=error"],
                        r"row 0, field 'messages': the sample is \d+ tokens .* over data.max_length=8"),
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def assert_one_line_error(status: int, stderr: str, pattern: str) -> str:
    assert status == 2, (status, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), last
    assert re.search(pattern, last), last
    return last


def run_in_process(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """``main_sft``'s entry (Hydra parsing included) in this process: (exit status, stderr)."""
    monkeypatch.setattr(sys, "argv", ["main_sft", *args])
    with pytest.raises(SystemExit) as exit_info:
        main_sft.main()
    return exit_info.value.code, capsys.readouterr().err


def data_overrides(tmp_path: Path, train_file: Path) -> list[str]:
    return [f"model.path={sft_assets().model}", f"data.train_files=[{train_file}]", "data.val_files=[]",
            f"trainer.default_local_dir={tmp_path / 'run'}"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_data_is_a_one_line_error(tmp_path, case, monkeypatch, capsys):
    rows, overrides, pattern = CASES[case]
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    status, stderr = run_in_process([*data_overrides(tmp_path, data), *overrides], monkeypatch, capsys)
    line = assert_one_line_error(status, stderr, pattern)
    assert str(data) in line, "the error names the file"


def test_the_command_line_exits_2_with_the_error_line(tmp_path):
    """The real ``python -m rlflow.trainer.main_sft`` process: a missing file is named, exit status 2."""
    missing = tmp_path / "nope" / "sft_train.parquet"
    result = run_main_sft(data_overrides(tmp_path, missing), timeout=120)
    assert_one_line_error(result.returncode, result.stderr, rf"data file {missing} does not exist")


def test_an_engine_layout_the_world_cannot_take_is_one_line(tmp_path, monkeypatch, capsys):
    """The engine class checks its layout against the model and the ranks (``BaseEngine.check_model``) before
    any worker starts: megatron at tensor x pipeline 2 x 2 on the default 1 process."""
    data = write_jsonl(tmp_path / "sft.jsonl", [{"messages": GOOD}])
    layout = ["engine=megatron", "engine.tensor_model_parallel_size=2", "engine.pipeline_model_parallel_size=2"]
    status, stderr = run_in_process([*data_overrides(tmp_path, data), *layout], monkeypatch, capsys)
    assert_one_line_error(status, stderr, r"config key 'engine': .* must divide the 1 worker processes")
    assert not (tmp_path / "run").exists()
