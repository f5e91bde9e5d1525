"""SFT datasets: the loss mask covers exactly the assistant tokens; truncation, collate and bad rows."""

from __future__ import annotations

import copy

import pytest

from rlflow.config import ConfigError
from rlflow.data.sft_dataset import SFTDataset
from rlflow.errors import DataError

END = "<|im_end|>"
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12+30?"},
    {"role": "assistant", "content": "12+30=42\n#### 42"},
    {"role": "user", "content": "And 1+1?"},
    {"role": "assistant", "content": "#### 2"},
]

# A template unlike the preset's: plain-text role headers and no {% generation %} markers.
PLAIN_TEMPLATE = (
    "{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}<|im_end|>{% endif %}\n\n{% endfor %}"
    "{% if add_generation_prompt %}### assistant:\n{% endif %}"
)


def masked_segments(tokenizer, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded runs of consecutive masked tokens."""
    segments, current = [], []
    for token, bit in zip(ids + [None], mask + [0]):
        if bit:
            current.append(token)
        elif current:
            segments.append(tokenizer.decode(current))
            current = []
    return segments


def hf_reference(tokenizer, messages) -> tuple[list[int], list[int]]:
    """transformers' own ids and assistant mask, from the preset template's {% generation %} markers."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_assistant_tokens_mask=True, return_dict=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def test_loss_mask_is_every_assistant_turn_with_its_end_token(tmp_path, tokenizer, write_rows):
    path = write_rows(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    sample = SFTDataset(path, tokenizer, max_length=256)[0]
    assert masked_segments(tokenizer, sample.input_ids, sample.loss_mask) == [CHAT[2]["content"] + END, CHAT[4]["content"] + END]
    assert (sample.input_ids, sample.loss_mask) == hf_reference(tokenizer, CHAT)


def test_loss_mask_works_for_a_template_without_generation_markers(tmp_path, tokenizer, write_rows):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = PLAIN_TEMPLATE
    path = write_rows(tmp_path / "chat.parquet", [{"messages": CHAT}])
    sample = SFTDataset(path, plain, max_length=256)[0]
    assert masked_segments(plain, sample.input_ids, sample.loss_mask) == [CHAT[2]["content"] + END, CHAT[4]["content"] + END]
    assert plain.decode(sample.input_ids) == plain.apply_chat_template(CHAT, tokenize=False)


@pytest.mark.parametrize("prompt", ["What is 2+2?", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]])
def test_prompt_response_pairs(tmp_path, tokenizer, write_rows, prompt):
    path = write_rows(tmp_path / "pairs.jsonl", [{"question": prompt, "answer": "2+2=4\n#### 4"}])
    sample = SFTDataset(path, tokenizer, prompt_key="question", response_key="answer")[0]
    assert masked_segments(tokenizer, sample.input_ids, sample.loss_mask) == ["2+2=4\n#### 4" + END]
    user = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    assert tokenizer.decode(sample.input_ids) == tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": "2+2=4\n#### 4"}], tokenize=False
    )


def test_verls_nested_extra_info_columns_load_through_dotted_keys(tmp_path, tokenizer, write_rows):
    """verl's GSM8K SFT files keep question and answer in the extra_info struct (its prompt_dict_keys=[question])."""
    rows = [{"extra_info": {"question": "What is 2+2?", "answer": "2+2=4\n#### 4", "index": 0}, "prompt": "unused"}]
    path = write_rows(tmp_path / "gsm8k.parquet", rows)
    sample = SFTDataset(path, tokenizer, prompt_key="extra_info.question", response_key="extra_info.answer")[0]
    assert tokenizer.decode(sample.input_ids) == tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "2+2=4\n#### 4"}], tokenize=False)
    assert masked_segments(tokenizer, sample.input_ids, sample.loss_mask) == ["2+2=4\n#### 4" + END]
    missing = write_rows(tmp_path / "missing.jsonl", [{"extra_info": {"question": "hi"}}])
    with pytest.raises(DataError, match=r"row 0, field 'extra_info.answer': missing"):
        SFTDataset(missing, tokenizer, prompt_key="extra_info.question", response_key="extra_info.answer")


@pytest.mark.parametrize("policy", ["left", "right"])
def test_truncation_keeps_the_right_tokens_and_mask(tmp_path, tokenizer, write_rows, policy):
    path = write_rows(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    ids, mask = hf_reference(tokenizer, CHAT)
    budget = len(ids) - 9
    sample = SFTDataset(path, tokenizer, max_length=budget, truncation=policy)[0]
    keep = slice(len(ids) - budget, None) if policy == "left" else slice(0, budget)
    assert sample.input_ids == ids[keep] and sample.loss_mask == mask[keep]


def test_collate_right_pads(tmp_path, tokenizer, write_rows):
    rows = [{"messages": CHAT}, {"messages": CHAT[1:3]}]
    dataset = SFTDataset(write_rows(tmp_path / "chat.jsonl", rows), tokenizer, max_length=256)
    batch = dataset.collate([1, 0])
    long_len, short_len = len(dataset[0].input_ids), len(dataset[1].input_ids)
    assert batch.batch["input_ids"].shape == (2, long_len)
    n_pad = long_len - short_len
    assert batch.batch["input_ids"][0].tolist() == dataset[1].input_ids + [tokenizer.pad_token_id] * n_pad
    assert batch.batch["attention_mask"][0].tolist() == [1] * short_len + [0] * n_pad
    assert batch.batch["loss_mask"][0].tolist() == dataset[1].loss_mask + [0] * n_pad
    assert batch.batch["position_ids"][0, :short_len].tolist() == list(range(short_len))
    assert batch.batch["position_ids"][1].tolist() == list(range(long_len))


def test_synthetic_task_sft_files_learn_the_worked_solution(tmp_path, tokenizer):
    from rlflow.data.tasks import build_task, write_task_files

    written = write_task_files(build_task("chain_arith"), tmp_path, n_train=6, n_val=2, seed=1)
    dataset = SFTDataset(written["sft_train"], tokenizer)
    import pyarrow.parquet as pq

    solutions = [m[-1]["content"] for m in pq.read_table(written["sft_train"]).column("messages").to_pylist()]
    for sample, solution in zip(dataset.samples, solutions):
        assert masked_segments(tokenizer, sample.input_ids, sample.loss_mask) == [solution + END]


BAD_SFT_ROWS = [
    ("no-assistant-turn", {"messages": CHAT[:2]}, "messages", "no assistant turn"),
    ("messages-missing", {"other": 1}, "messages", "missing"),
    ("role-not-string", {"messages": [{"role": 3, "content": "x"}]}, "messages[0].role", "must be a string"),
    ("messages-not-list", {"messages": "hello"}, "messages", "non-empty list"),
]


@pytest.mark.parametrize("row,field,problem", [pytest.param(r, f, p, id=i) for i, r, f, p in BAD_SFT_ROWS])
def test_bad_chat_row_names_file_row_and_field(tmp_path, tokenizer, write_rows, row, field, problem):
    path = write_rows(tmp_path / "chat.jsonl", [{"messages": CHAT}, row])
    with pytest.raises(DataError) as info:
        SFTDataset(path, tokenizer, max_length=256)
    message = str(info.value)
    assert str(path) in message and "row 1," in message and f"field {field!r}" in message and problem in message


@pytest.mark.parametrize("row,field", [({"q": "hi"}, "a"), ({"q": 5, "a": "x"}, "q"), ({"a": "x"}, "q")], ids=["no-response", "prompt-int", "no-prompt"])
def test_bad_pair_row_names_the_field(tmp_path, tokenizer, write_rows, row, field):
    path = write_rows(tmp_path / "pairs.jsonl", [{"q": "hi", "a": "yo"}, row])
    with pytest.raises(DataError) as info:
        SFTDataset(path, tokenizer, prompt_key="q", response_key="a")
    assert str(path) in str(info.value) and "row 1," in str(info.value) and f"field {field!r}" in str(info.value)


def test_overlong_sample_under_error_names_file_and_row(tmp_path, tokenizer, write_rows):
    path = write_rows(tmp_path / "chat.parquet", [{"messages": CHAT[1:3]}, {"messages": CHAT}])
    ids, _ = hf_reference(tokenizer, CHAT)
    with pytest.raises(DataError) as info:
        SFTDataset(path, tokenizer, max_length=len(ids) - 1, truncation="error")
    message = str(info.value)
    assert str(path) in message and "row 1," in message and f"the sample is {len(ids)} tokens after the chat template, over data.max_length={len(ids) - 1}" in message


def test_config_mistakes_are_config_errors(tmp_path, tokenizer, write_rows):
    path = write_rows(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    with pytest.raises(ConfigError, match="prompt_key"):
        SFTDataset(path, tokenizer, prompt_key="q")
    with pytest.raises(ConfigError, match="data.truncation"):
        SFTDataset(path, tokenizer, truncation="filter")
