"""``rlflow-data gsm8k|math``: public-dataset files -> verl parquet that RLDataset reads and the rewards score.

The source rows are written here in the public datasets' layouts (GSM8K: ``question``/``answer``
ending in ``#### n``; MATH: ``problem``/``solution`` with ``\\boxed{}``, ``level``, ``type``);
the problems are made up for these tests.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlflow.data.cli import main
from rlflow.data.outputs import OUTPUTS_MARKER
from rlflow.data.rl_dataset import RLDataset
from rlflow.rewards import get_reward_fn

GSM8K_TRAIN = [
    {"question": "A baker fills 3 trays with 12 rolls each and sells 20 rolls. How many rolls are left?",
     "answer": "The trays hold 3*12=<<3*12=36>>36 rolls.\nAfter selling, 36-20=<<36-20=16>>16 rolls remain.\n#### 16"},
    {"question": "Tom reads 15 pages a day for 4 days, then 1,000 more pages. How many pages did he read?",
     "answer": "He reads 15*4=<<15*4=60>>60 pages first.\nIn all 60+1000=<<60+1000=1060>>1060 pages.\n#### 1,060"},
]
GSM8K_TEST = [
    {"question": "A rope of 9 meters is cut into pieces of 3 meters. How many pieces are there?",
     "answer": "9/3=<<9/3=3>>3 pieces.\n#### 3"},
]
MATH_ROWS = [
    {"problem": "What is $\\frac{1}{4}+\\frac{1}{4}$?", "level": "Level 1", "type": "Prealgebra",
     "solution": "Adding gives $\\frac{2}{4}=\\boxed{\\frac{1}{2}}$."},
    {"problem": "Solve $x^2=9$ for $x>0$.", "level": "Level 2", "type": "Algebra",
     "solution": "The roots are $\\pm 3$; the positive one is $\\boxed{3}$."},
]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def gsm8k_folder(tmp_path):
    """GSM8K as HF ships it: train as parquet shards, test as json lines."""
    src = tmp_path / "gsm8k" / "main"
    src.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(GSM8K_TRAIN), src / "train-00000-of-00001.parquet")
    write_jsonl(src / "test.jsonl", GSM8K_TEST)
    return src


def test_gsm8k_rows_are_verl_format_read_by_rl_dataset_and_scored(gsm8k_folder, tmp_path, tokenizer, capsys):
    out = tmp_path / "out"
    assert main(["gsm8k", "--src", str(gsm8k_folder), "--out", str(out)]) == 0
    assert "train: 2 rows" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [OUTPUTS_MARKER, "test.parquet", "train.parquet"]

    schema = pq.read_schema(out / "train.parquet")
    assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert str(schema.field("prompt").type) == "list<element: struct<role: string, content: string>>"
    assert str(schema.field("reward_model").type) == "struct<style: string, ground_truth: string>"
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert [row["reward_model"] for row in rows] == [{"style": "rule", "ground_truth": "16"},
                                                    {"style": "rule", "ground_truth": "1060"}]
    assert rows[1]["extra_info"] == {"split": "train", "index": 1, **GSM8K_TRAIN[1]}
    assert all(row["data_source"] == "openai/gsm8k" and row["ability"] == "math" for row in rows)
    assert rows[0]["prompt"][0]["role"] == "user"
    assert rows[0]["prompt"][0]["content"].startswith(GSM8K_TRAIN[0]["question"] + " ")
    assert "####" in rows[0]["prompt"][0]["content"]  # the instruction names the answer format

    dataset = RLDataset(out / "test.parquet", tokenizer, max_prompt_length=256)
    batch = dataset.collate([0])
    assert list(batch.non_tensor_batch["ground_truth"]) == ["3"]
    assert batch.non_tensor_batch["extra_info"][0]["split"] == "test"

    score = get_reward_fn("openai/gsm8k")
    for row, source in zip(rows, GSM8K_TRAIN):
        truth = row["reward_model"]["ground_truth"]
        assert score("openai/gsm8k", source["answer"], truth) == 1.0  # the reference solution
        wrong = source["answer"].rsplit("####", 1)[0] + "#### 7"
        assert score("openai/gsm8k", wrong, truth) == 0.0


def test_math_json_and_hendrycks_tree_give_the_last_box_as_truth(tmp_path, tokenizer):
    lighteval = tmp_path / "lighteval" / "test.json"
    lighteval.parent.mkdir()
    lighteval.write_text(json.dumps(MATH_ROWS))
    tree = tmp_path / "MATH"  # hendrycks: one pretty-printed object per problem, train/<type>/<id>.json
    for index, row in enumerate(MATH_ROWS):
        problem_file = tree / "train" / row["type"].lower() / f"{index}.json"
        problem_file.parent.mkdir(parents=True)
        problem_file.write_text(json.dumps(row, indent=4))
    out = tmp_path / "out"
    assert main(["math", "--src", str(lighteval), str(tree), "--out", str(out)]) == 0

    train = pq.read_table(out / "train.parquet").to_pylist()
    test = pq.read_table(out / "test.parquet").to_pylist()
    # the tree's files are read in path order: algebra/1.json before prealgebra/0.json
    assert [row["reward_model"]["ground_truth"] for row in train] == ["3", "\\frac{1}{2}"]
    assert [row["reward_model"]["ground_truth"] for row in test] == ["\\frac{1}{2}", "3"]
    assert test[0]["extra_info"] == {"split": "test", "index": 0, **MATH_ROWS[0]}
    data_source = test[0]["data_source"]
    assert "\\boxed{}" in test[0]["prompt"][0]["content"]
    assert len(RLDataset(out / "train.parquet", tokenizer, max_prompt_length=256)) == 2

    score = get_reward_fn(data_source)
    for row, source in zip(test, MATH_ROWS):
        truth = row["reward_model"]["ground_truth"]
        assert score(data_source, source["solution"], truth) == 1.0
        assert score(data_source, "so the answer is $\\boxed{4}$", truth) == 0.0


@pytest.mark.parametrize("command, row, field", [
    ("gsm8k", {"question": "How many?"}, "answer': missing"),
    ("gsm8k", {"question": "How many?", "answer": "It is five."}, "answer': has no final answer"),
    ("gsm8k", {"question": "How many?", "answer": "#### five"}, "must be a number, got 'five'"),
    ("gsm8k", {"question": 7, "answer": "#### 7"}, "question': must be a non-empty string"),
    ("math", {"problem": "Find x.", "solution": "x is 2."}, "solution': has no \\boxed"),
    ("math", {"problem": "Find x.", "solution": "\\boxed{2", "level": 3}, "solution': has no \\boxed"),
    ("math", {"problem": "Find x.", "solution": "\\boxed{2}", "level": 3}, "level': must be a string"),
])
def test_bad_row_is_one_line_naming_file_row_and_field_and_writes_nothing(tmp_path, capsys, command, row, field):
    good = GSM8K_TRAIN[0] if command == "gsm8k" else MATH_ROWS[0]
    src = write_jsonl(tmp_path / "train.jsonl", [good, row])
    out = tmp_path / "out"
    assert main([command, "--src", str(src), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"error: data file {src}, row 1, field '")
    assert field in error
    assert not out.exists()


@pytest.mark.parametrize("setup, message", [
    (lambda tmp: tmp / "absent.parquet", "does not exist"),
    (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "holds no .json/.jsonl/.parquet files"),
    (lambda tmp: write_jsonl(tmp / "gsm8k.csv", []), "unknown data file format '.csv'; registered: .json, .jsonl, .parquet"),
    (lambda tmp: write_jsonl(tmp / "rows.jsonl", GSM8K_TEST), "cannot tell the split of"),
])
def test_bad_sources_exit_2_with_one_line(tmp_path, capsys, setup, message):
    assert main(["gsm8k", "--src", str(setup(tmp_path)), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error


def test_out_folder_holding_the_source_is_refused_and_the_source_kept(gsm8k_folder, capsys):
    source = gsm8k_folder / "train.parquet"
    (gsm8k_folder / "train-00000-of-00001.parquet").rename(source)
    before = source.read_bytes()
    assert main(["gsm8k", "--src", str(gsm8k_folder), "--out", str(gsm8k_folder)]) == 2
    assert "would overwrite the source file" in capsys.readouterr().err
    assert source.read_bytes() == before and not (gsm8k_folder / "test.parquet").exists()


def test_split_flag_names_a_file_without_a_split_in_its_name(tmp_path):
    src = write_jsonl(tmp_path / "rows.jsonl", GSM8K_TEST)
    assert main(["gsm8k", "--src", str(src), "--out", str(tmp_path / "out"), "--split", "validation"]) == 0
    assert pq.read_table(tmp_path / "out" / "validation.parquet").to_pylist()[0]["extra_info"]["split"] == "validation"


def test_task_command_writes_what_the_tasks_module_writes(tmp_path):
    from rlflow.data.cli import tasks_module_main

    options = ["--out", "", "--train", "6", "--val", "3", "--seed", "1", "--digits", "1", "--num-ops", "2"]
    for name, run in (("new", lambda o: main(["task", "chain_arith", *o])),
                      ("old", lambda o: tasks_module_main(["--task", "chain_arith", *o]))):
        options[1] = str(tmp_path / name)
        assert run(options) == 0
    for file in ("train.parquet", "val.parquet", "sft_train.parquet", "sft_val.parquet"):
        assert pq.read_table(tmp_path / "new" / file).equals(pq.read_table(tmp_path / "old" / file))
    assert main(["task", "addition", "--out", str(tmp_path / "x"), "--train", "1", "--val", "1", "--num-ops", "2"]) == 2
