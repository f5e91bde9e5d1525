"""data.apply_chat_template_kwargs: extra chat-template variables (Qwen3's enable_thinking) reach the
RL prompts and the SFT conversations, read from a tokenizer folder whose template uses one."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rlflow.data.rl_dataset import RLDataset
from rlflow.data.sft_dataset import SFTDataset
from rlflow.errors import UserError
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config

# ChatML with Qwen3's switch: enable_thinking=false puts an empty think block after every assistant header
# (the generation prompt's too), and, for this test, a system line before the conversation.
THINKING_TEMPLATE = (
    "{%- set no_think = enable_thinking is defined and not enable_thinking %}"
    "{%- if no_think %}{{- '<|im_start|>system\\nno thinking<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' and no_think %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if no_think %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
NO_THINKING = {"enable_thinking": False}


@pytest.fixture(scope="module")
def thinking_tokenizer(tokenizer, tmp_path_factory):
    """The preset tokenizer saved as a folder with the thinking template, loaded back the way rlflow loads one."""
    folder = tmp_path_factory.mktemp("thinking_tokenizer")
    original = tokenizer.chat_template
    tokenizer.chat_template = THINKING_TEMPLATE
    try:
        tokenizer.save_pretrained(folder)
    finally:
        tokenizer.chat_template = original  # the session tokenizer is shared with other tests
    return AutoTokenizer.from_pretrained(folder)


def hf_ids(tokenizer, messages, **kwargs) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True,
                                              **kwargs)["input_ids"])


def test_rl_prompts_follow_the_template_kwargs(tmp_path, thinking_tokenizer, write_rows, rl_row):
    path = write_rows(tmp_path / "train.parquet", [rl_row(i) for i in range(2)])
    messages = rl_row(0)["prompt"]
    plain = RLDataset(path, thinking_tokenizer, max_prompt_length=64)[0].input_ids
    config = compose_ppo_config([f"data.train_files=[{path}]", "data.max_prompt_length=64",
                                 "+data.apply_chat_template_kwargs.enable_thinking=false"])
    no_thinking = RLDataset.from_config(config.data, thinking_tokenizer, "train")[0].input_ids
    assert plain == hf_ids(thinking_tokenizer, messages)
    assert no_thinking == hf_ids(thinking_tokenizer, messages, **NO_THINKING) != plain
    assert thinking_tokenizer.decode(no_thinking).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_sft_conversations_follow_the_template_kwargs(tmp_path, thinking_tokenizer, write_rows):
    chat = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "#### 5"}]
    path = write_rows(tmp_path / "sft.parquet", [{"messages": chat}])
    config = compose_sft_config([f"data.train_files=[{path}]", "+data.apply_chat_template_kwargs.enable_thinking=false"])
    sample = SFTDataset.from_config(config.data, thinking_tokenizer, "train")[0]
    text = thinking_tokenizer.decode(sample.input_ids)
    assert text.startswith("<|im_start|>system\nno thinking<|im_end|>\n")
    learned = thinking_tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])
    assert learned == "#### 5<|im_end|>"


def test_a_kwarg_rlflow_sets_itself_is_refused(tmp_path, tokenizer, write_rows, rl_row):
    path = write_rows(tmp_path / "train.parquet", [rl_row(0)])
    with pytest.raises(UserError, match=r"^config key 'data.apply_chat_template_kwargs': add_generation_prompt"):
        RLDataset(path, tokenizer, apply_chat_template_kwargs={"add_generation_prompt": False})
