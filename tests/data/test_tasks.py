"""Synthetic tasks: deterministic generators, disjoint splits, verl-format files, and the answer scorer."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlflow.data.tasks import (
    RL_FILES,
    SFT_FILES,
    TASK_REGISTRY,
    build_task,
    generate_splits,
    rl_row,
    score,
    sft_row,
    write_task_files,
)
from rlflow.utils.registry import UnknownNameError

_EXPRESSION = re.compile(r"What is ([0-9+\-]+)\? Answer with the number after ####\.")
_STEP = re.compile(r"^(\d+)([+-])(\d+)=(\d+)$")


def _evaluate(expression: str) -> int:
    """Left-to-right value of a digits/+/- expression, computed independently of the generators."""
    tokens = re.findall(r"[+-]|\d+", expression)
    value = int(tokens[0])
    for op, number in zip(tokens[1::2], tokens[2::2]):
        value = value + int(number) if op == "+" else value - int(number)
    return value


@pytest.mark.parametrize("name", sorted(TASK_REGISTRY))
def test_generator_is_deterministic_per_seed(name):
    task = build_task(name)
    first = [task.sample(random.Random(7)) for _ in range(3)]
    again = [task.sample(random.Random(7)) for _ in range(3)]
    stream_a = generate_splits(task, 50, 10, seed=3)
    stream_b = generate_splits(task, 50, 10, seed=3)
    other = generate_splits(task, 50, 10, seed=4)
    assert first == again
    assert stream_a == stream_b
    assert stream_a[0] != other[0]


@pytest.mark.parametrize("name", ["addition", "chain_arith"])
def test_examples_are_correct_and_solutions_score_one(name):
    task = build_task(name)
    rng = random.Random(0)
    for _ in range(200):
        example = task.sample(rng)
        expression = _EXPRESSION.fullmatch(example.prompt).group(1)
        assert int(example.ground_truth) == _evaluate(expression)
        assert example.solution.endswith(f"#### {example.ground_truth}")
        assert score(name, example.solution, example.ground_truth) == 1.0


def test_tool_product_traces_call_the_calculator_and_rows_name_the_tool_loop():
    import json

    task = build_task("tool_product", digits=2, operands=3)
    example = task.sample(random.Random(0))
    numbers = [int(n) for n in re.fullmatch(r"What is ([0-9*]+)\? Use the calculator, .*", example.prompt).group(1).split("*")]
    assert len(numbers) == 3 and all(10 <= n <= 99 for n in numbers)
    call, result, final = example.turns
    body = json.loads(call["content"].removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert body == {"name": "calculator", "arguments": {"expression": "*".join(map(str, numbers))}}
    assert result == {"role": "tool", "content": str(numbers[0] * numbers[1] * numbers[2])} == {"role": "tool", "content": example.ground_truth}
    assert final == {"role": "assistant", "content": f"#### {example.ground_truth}"}
    assert score("tool_product", final["content"], example.ground_truth) == 1.0
    assert rl_row(task, example, "train", 0)["agent_name"] == "tool_agent"
    assert "agent_name" not in rl_row(build_task("addition"), build_task("addition").sample(random.Random(0)), "train", 0)
    assert [m["role"] for m in sft_row(task, example, "train", 0)["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_tool_product_answers_a_share_of_its_traces_without_the_tool():
    task = build_task("tool_product", digits=2, direct_percent=30)
    rng = random.Random(0)
    examples = [task.sample(rng) for _ in range(1000)]
    direct = [e for e in examples if not e.turns]
    assert 0.25 < len(direct) / len(examples) < 0.35
    assert all(sft_row(task, e, "train", 0)["messages"][1] == {"role": "assistant", "content": e.solution} for e in direct)
    with pytest.raises(ValueError, match="direct_percent must be in \\[0, 100\\]"):
        build_task("tool_product", direct_percent=101)


def test_chain_arith_steps_are_valid_and_nonnegative():
    task = build_task("chain_arith", digits=2, num_ops=3)
    rng = random.Random(1)
    for _ in range(200):
        example = task.sample(rng)
        *steps, final = example.solution.split("\n")
        assert len(steps) == 3
        previous = None
        for step in steps:
            a, op, b, result = _STEP.match(step).groups()
            assert int(result) == (int(a) + int(b) if op == "+" else int(a) - int(b))
            assert int(result) >= 0
            assert previous is None or int(a) == previous
            previous = int(result)
        assert final == f"#### {previous}"


def test_train_and_val_are_disjoint_and_val_ignores_train_size():
    task = build_task("addition", digits=2)
    train, val = generate_splits(task, 3000, 500, seed=0)
    train_prompts, val_prompts = [e.prompt for e in train], [e.prompt for e in val]
    assert len(set(train_prompts)) == 3000 and len(set(val_prompts)) == 500
    assert not set(train_prompts) & set(val_prompts)
    _, val_again = generate_splits(task, 10, 500, seed=0)
    assert val_again == val


def test_too_small_problem_space_is_a_clear_error():
    task = build_task("addition", digits=1)  # only 100 distinct problems
    with pytest.raises(ValueError, match="distinct problems"):
        generate_splits(task, 150, 10, seed=0)


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="no option"):
        build_task("addition", num_ops=2)
    with pytest.raises(ValueError, match="positive integer"):
        build_task("chain_arith", digits=0)
    with pytest.raises(UnknownNameError, match="unknown synthetic task 'sorting'; registered: addition, chain_arith"):
        build_task("sorting")


def test_parquet_files_are_in_verl_format(tmp_path):
    task = build_task("chain_arith", num_ops=2)
    paths = write_task_files(task, tmp_path, n_train=40, n_val=12, seed=5)
    assert sorted(p.name for p in paths.values()) == sorted([*RL_FILES.values(), *SFT_FILES.values()])
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    val = pq.read_table(tmp_path / "val.parquet").to_pylist()
    assert len(train) == 40 and len(val) == 12
    assert set(train[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    for split, rows in (("train", train), ("val", val)):
        for index, row in enumerate(rows):
            assert row["data_source"] == "synthetic/chain_arith"
            assert [m["role"] for m in row["prompt"]] == ["user"]
            assert row["reward_model"]["style"] == "rule"
            expression = _EXPRESSION.fullmatch(row["prompt"][0]["content"]).group(1)
            assert row["reward_model"]["ground_truth"] == str(_evaluate(expression))
            assert row["extra_info"]["split"] == split and row["extra_info"]["index"] == index
    train_prompts = {r["prompt"][0]["content"] for r in train}
    assert not train_prompts & {r["prompt"][0]["content"] for r in val}

    sft = pq.read_table(tmp_path / "sft_train.parquet").to_pylist()
    assert len(sft) == 40
    for rl, row in zip(train, sft):
        user, assistant = row["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert user["content"] == rl["prompt"][0]["content"]
        assert score(row["data_source"], assistant["content"], rl["reward_model"]["ground_truth"]) == 1.0
    assert len(pq.read_table(tmp_path / "sft_val.parquet")) == 12


@pytest.mark.parametrize(
    "solution, truth, expected",
    [
        ("123+456=579\n#### 579", "579", 1.0),
        ("123+456=578\n#### 578", "579", 0.0),
        ("#### 579<|im_end|>", "579", 1.0),
        ("####579", "579", 1.0),
        ("#### 1,234", "1234", 1.0),
        ("#### 0579", "579", 1.0),
        ("#### -5", "-5", 1.0),
        ("#### 12\nwait\n#### 579", "579", 1.0),
        ("#### 579\nno, #### 12", "579", 0.0),
        ("the answer is 579", "579", 0.0),
        ("#### the answer is 579", "579", 0.0),
        ("#### 5790", "579", 0.0),
        ("", "579", 0.0),
        (None, "579", 0.0),
        ("#### 579", "not a number", 0.0),
        ("#### 579", 579, 1.0),
    ],
)
def test_score_hand_cases(solution, truth, expected):
    assert score("addition", solution, truth) == expected
    assert score("synthetic/chain_arith", solution, truth) == expected


@given(st.integers(-10**9, 10**9), st.integers(-10**9, 10**9), st.text(max_size=40))
def test_score_matches_only_the_right_number(answer, other, junk):
    text = f"{junk}\n#### {answer}"
    assert score("addition", text, str(answer)) == 1.0
    assert score("addition", text, str(other)) == (1.0 if other == answer else 0.0)
    assert score("addition", junk, str(answer)) in (0.0, 1.0)


def test_score_unknown_task_lists_registered():
    with pytest.raises(UnknownNameError, match="addition"):
        score("synthetic/unknown", "#### 1", "1")


def test_cli_writes_files_and_rejects_foreign_options(tmp_path):
    cmd = [sys.executable, "-m", "rlflow.data.tasks", "--task", "addition", "--out", str(tmp_path),
           "--train", "30", "--val", "5", "--seed", "2", "--digits", "4"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = pq.read_table(tmp_path / "val.parquet").to_pylist()
    assert len(rows) == 5 and rows[0]["data_source"] == "synthetic/addition"
    expression = _EXPRESSION.fullmatch(rows[0]["prompt"][0]["content"]).group(1)
    assert all(len(n) <= 4 for n in expression.split("+"))
    bad = subprocess.run(cmd + ["--num-ops", "2"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no option(s) ['num_ops']" in bad.stderr
