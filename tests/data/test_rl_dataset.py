"""RL prompt datasets: verl rows -> left-padded DataProto batches; bad rows and files -> DataError naming them."""

from __future__ import annotations

import copy

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlflow.config import ConfigError
from rlflow.data.rl_dataset import RLDataset
from rlflow.errors import DataError

ROWS = 4
BAD_ROW = 2


def hf_prompt_ids(tokenizer, messages) -> list[int]:
    """Reference prompt ids straight from transformers' own tokenizing chat-template call."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)
    return list(out["input_ids"])


def test_collate_left_pads_with_positions_from_first_real_token(tmp_path, tokenizer, write_rows, rl_row):
    rows = [rl_row(i) for i in range(ROWS)]
    rows[1] = rl_row(1, content="Hi")  # a shorter prompt, so the batch mixes padding amounts
    path = write_rows(tmp_path / "train.parquet", rows)
    dataset = RLDataset(path, tokenizer, max_prompt_length=40)
    batch = dataset.collate([1, 3], epoch=5)

    assert batch.batch["input_ids"].shape == (2, 40)
    for row, index in enumerate([1, 3]):
        expected = hf_prompt_ids(tokenizer, rows[index]["prompt"])
        mask = batch.batch["attention_mask"][row]
        n_pad = 40 - len(expected)
        assert mask.tolist() == [0] * n_pad + [1] * len(expected)
        assert batch.batch["input_ids"][row, n_pad:].tolist() == expected
        assert (batch.batch["input_ids"][row, :n_pad] == tokenizer.pad_token_id).all()
        assert batch.batch["position_ids"][row].tolist() == [0] * n_pad + list(range(len(expected)))
    assert list(batch.non_tensor_batch["uid"]) == ["5-1", "5-3"]
    assert list(batch.non_tensor_batch["ground_truth"]) == ["2", "6"]
    assert list(batch.non_tensor_batch["data_source"]) == ["synthetic/addition"] * 2
    assert batch.non_tensor_batch["raw_prompt"][1] == rows[3]["prompt"]
    assert batch.non_tensor_batch["extra_info"][0] == {"index": 1}


def test_folder_reads_parquet_and_jsonl_in_name_order(tmp_path, tokenizer, write_rows, rl_row):
    write_rows(tmp_path / "data" / "b.jsonl", [rl_row(10), rl_row(11)])
    write_rows(tmp_path / "data" / "a.parquet", [rl_row(0)])
    (tmp_path / "data" / "notes.txt").write_text("ignored")
    dataset = RLDataset(tmp_path / "data", tokenizer)
    assert [row.ground_truth for row in dataset.rows] == ["0", "20", "22"]


def test_agent_name_column_is_carried_only_when_rows_name_a_loop(tmp_path, tokenizer, write_rows, rl_row):
    plain = RLDataset(write_rows(tmp_path / "plain.jsonl", [rl_row(0), rl_row(1)]), tokenizer)
    assert "agent_name" not in plain.collate([0, 1]).non_tensor_batch
    named = [rl_row(0), {**rl_row(1), "agent_name": "tool_agent"}]
    dataset = RLDataset(write_rows(tmp_path / "named.jsonl", named), tokenizer)
    assert list(dataset.collate([0, 1]).non_tensor_batch["agent_name"]) == ["", "tool_agent"]


def _drop(key):
    def mutate(row):
        del row[key]
    return mutate


def _set(path, value):
    def mutate(row):
        node = row
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return mutate


def _drop_nested(path):
    def mutate(row):
        node = row
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return mutate


# (case id, mutation of row BAD_ROW, field named in the error, formats that can hold the bad row)
MALFORMED = [
    ("missing-prompt", _drop("prompt"), "prompt", ("parquet", "jsonl")),
    ("prompt-is-string", _set(["prompt"], "What is 1+1?"), "prompt", ("jsonl",)),
    ("prompt-empty", _set(["prompt"], []), "prompt", ("parquet", "jsonl")),
    ("message-without-role", _drop_nested(["prompt", 0, "role"]), "prompt[0].role", ("parquet", "jsonl")),
    ("message-content-int", _set(["prompt", 0, "content"], 7), "prompt[0].content", ("jsonl",)),
    ("message-not-dict", _set(["prompt", 0], "hello"), "prompt[0]", ("jsonl",)),
    ("missing-reward-model", _drop("reward_model"), "reward_model", ("parquet", "jsonl")),
    ("missing-ground-truth", _drop_nested(["reward_model", "ground_truth"]), "reward_model.ground_truth", ("parquet", "jsonl")),
    ("ground-truth-dict", _set(["reward_model", "ground_truth"], {"a": 1}), "reward_model.ground_truth", ("jsonl",)),
    ("ground-truth-bool", _set(["reward_model", "ground_truth"], True), "reward_model.ground_truth", ("jsonl",)),
    ("missing-data-source", _drop("data_source"), "data_source", ("parquet", "jsonl")),
    ("extra-info-string", _set(["extra_info"], "oops"), "extra_info", ("jsonl",)),
    ("agent-name-number", _set(["agent_name"], 3), "agent_name", ("jsonl",)),
]
CASES = [pytest.param(mutate, field, fmt, id=f"{name}-{fmt}") for name, mutate, field, fmts in MALFORMED for fmt in fmts]


@pytest.mark.parametrize("mutate,field,fmt", CASES)
def test_malformed_row_names_file_row_and_field(tmp_path, tokenizer, write_rows, rl_row, mutate, field, fmt):
    rows = [rl_row(i) for i in range(ROWS)]
    rows[BAD_ROW] = copy.deepcopy(rows[BAD_ROW])
    mutate(rows[BAD_ROW])
    path = write_rows(tmp_path / f"train.{fmt}", rows)
    with pytest.raises(DataError) as info:
        RLDataset(path, tokenizer)
    message = str(info.value)
    assert str(path) in message
    assert f"row {BAD_ROW}," in message
    assert f"field {field!r}" in message


def test_missing_file_is_named(tmp_path, tokenizer, write_rows, rl_row):
    good = write_rows(tmp_path / "good.parquet", [rl_row(0)])
    missing = tmp_path / "nope" / "train.parquet"
    with pytest.raises(DataError, match="does not exist") as info:
        RLDataset([good, missing], tokenizer)
    assert str(missing) in str(info.value)


@pytest.mark.parametrize(
    "setup,match",
    [
        (lambda d: (d / "empty").mkdir() or d / "empty", "holds no"),
        (lambda d: (d / "x.csv").write_text("a,b\n") and d / "x.csv", "unknown data file format '.csv'"),
        (lambda d: (d / "x.parquet").write_bytes(b"not parquet") and d / "x.parquet", "cannot be read"),
        (lambda d: (d / "x.jsonl").write_text('{"a": 1}\n{broken\n') and d / "x.jsonl", "line 2 is not valid JSON"),
        (lambda d: (d / "x.json").write_text('[{"a": 1},\n{"a": 2') and d / "x.json",
         r"not valid JSON at line 2, column 8 \(character 18\): .* \(the text ends early: cut off\?\)"),
        (lambda d: (d / "x.jsonl").write_bytes(b'{"a": 1}\n{"a": "\xff"}\n') and d / "x.jsonl",
         r"not UTF-8 text at byte 16 \(line 2: invalid start byte\)"),
        (lambda d: pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), d / "x.parquet") or d / "x.parquet",
         "holds no rows"),
    ],
    ids=["empty-folder", "csv", "corrupt-parquet", "broken-json-line", "cut-json-list", "invalid-utf8", "zero-row-parquet"],
)
def test_unreadable_inputs_name_the_file(tmp_path, tokenizer, setup, match):
    path = setup(tmp_path)
    with pytest.raises(DataError, match=match) as info:
        RLDataset(path, tokenizer)
    assert str(path) in str(info.value)


LONG = "What is " + "+".join(str(i) for i in range(30)) + "? Answer with the number after ####."


@pytest.fixture
def long_prompt_file(tmp_path, write_rows, rl_row):
    return write_rows(tmp_path / "train.jsonl", [rl_row(0), rl_row(1, content=LONG), rl_row(2)])


def _budget(tokenizer, rl_row) -> tuple[list[int], int]:
    full = hf_prompt_ids(tokenizer, rl_row(1, content=LONG)["prompt"])
    return full, len(full) - 7


def test_overlong_prompt_under_error_names_row_and_limit(long_prompt_file, tokenizer, rl_row):
    full, budget = _budget(tokenizer, rl_row)
    with pytest.raises(DataError) as info:
        RLDataset(long_prompt_file, tokenizer, max_prompt_length=budget, truncation="error", filter_overlong_prompts=False)
    message = str(info.value)
    assert str(long_prompt_file) in message and "row 1," in message and "field 'prompt'" in message
    assert f"the prompt is {len(full)} tokens after the chat template, over data.max_prompt_length={budget}" in message


@pytest.mark.parametrize("policy", ["left", "right"])
def test_left_and_right_truncation_keep_the_right_tokens(long_prompt_file, tokenizer, rl_row, policy):
    full, budget = _budget(tokenizer, rl_row)
    dataset = RLDataset(long_prompt_file, tokenizer, max_prompt_length=budget, truncation=policy, filter_overlong_prompts=False)
    assert len(dataset) == 3
    expected = full[-budget:] if policy == "left" else full[:budget]
    assert dataset[1].input_ids == expected
    batch = dataset.collate([1])
    assert batch.batch["input_ids"][0].tolist() == expected and bool(batch.batch["attention_mask"].all())
    assert dataset[0].input_ids == hf_prompt_ids(tokenizer, rl_row(0)["prompt"])  # short rows untouched


@pytest.mark.parametrize("policy,filter_flag", [("filter", False), ("error", True), ("left", True)])
def test_filter_drops_overlong_prompts_and_counts_them(long_prompt_file, tokenizer, rl_row, policy, filter_flag):
    _, budget = _budget(tokenizer, rl_row)
    dataset = RLDataset(long_prompt_file, tokenizer, max_prompt_length=budget, truncation=policy, filter_overlong_prompts=filter_flag)
    assert len(dataset) == 2 and dataset.num_dropped == 1
    assert [row.ground_truth for row in dataset.rows] == ["0", "4"]


def test_unknown_truncation_policy_is_a_config_error(long_prompt_file, tokenizer):
    with pytest.raises(ConfigError, match="data.truncation"):
        RLDataset(long_prompt_file, tokenizer, truncation="middle")


def test_prompts_match_the_synthetic_task_files(tmp_path, tokenizer):
    from rlflow.data.tasks import build_task, write_task_files

    written = write_task_files(build_task("addition", digits=2), tmp_path, n_train=12, n_val=4, seed=0)
    dataset = RLDataset(written["train"], tokenizer, max_prompt_length=48)
    batch = dataset.collate(list(range(len(dataset))))
    for row in range(len(dataset)):
        mask = batch.batch["attention_mask"][row].bool()
        text = tokenizer.decode(batch.batch["input_ids"][row][mask])
        prompt = batch.non_tensor_batch["raw_prompt"][row][0]["content"]
        assert text == f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        a, b = prompt.removeprefix("What is ").split("?")[0].split("+")
        assert batch.non_tensor_batch["ground_truth"][row] == str(int(a) + int(b))
    assert torch.equal(batch.batch["position_ids"].max(dim=1).values + 1, batch.batch["attention_mask"].sum(dim=1))
