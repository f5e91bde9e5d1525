"""verl's single-value forms: taken where verl takes them, else one line naming the form, never OmegaConf's type error."""

from __future__ import annotations

import pytest

from one_line_errors import one_line_error
from rlflow.config import ConfigError
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config


def test_a_single_value_where_a_list_of_strings_is_wanted_is_a_one_item_list():
    config = compose_ppo_config(["data.train_files=/data/train.parquet", "data.val_files=/data/val.parquet",
                                 "trainer.logger=console", "actor.engine.lora.target_modules=all-linear",
                                 "ref.engine.wrap_layer_classes=Qwen2DecoderLayer"])
    assert list(config.data.train_files) == ["/data/train.parquet"] and list(config.data.val_files) == ["/data/val.parquet"]
    assert list(config.trainer.logger) == ["console"]
    assert list(config.actor.engine.lora.target_modules) == ["all-linear"]
    assert list(config.ref.engine.wrap_layer_classes) == ["Qwen2DecoderLayer"]
    sft = compose_sft_config(["data.train_files=/data/sft.parquet", "engine.lora.target_modules=q_proj"])
    assert list(sft.data.train_files) == ["/data/sft.parquet"] and list(sft.engine.lora.target_modules) == ["q_proj"]


def test_lists_and_interpolations_are_left_as_they_are():
    config = compose_ppo_config(["data.train_files=[/a.parquet,/b.parquet]", "trainer.logger=[console,jsonl]"])
    assert list(config.data.train_files) == ["/a.parquet", "/b.parquet"] and list(config.trainer.logger) == ["console", "jsonl"]


@pytest.mark.parametrize("override, expected", [
    ("actor.engine.optimizer.betas=0.9", "config key 'actor.engine.optimizer.betas': expected a list, got the single value "
                                         "0.9; write actor.engine.optimizer.betas=[a,b]"),
    ("data.apply_chat_template_kwargs=thinking", "config key 'data.apply_chat_template_kwargs': expected a mapping, got the "
                                                 "single value 'thinking'; write data.apply_chat_template_kwargs={name: value} "
                                                 "or +data.apply_chat_template_kwargs.name=value"),
])
def test_a_single_value_of_another_form_is_one_line_naming_the_form(override, expected):
    assert one_line_error(compose_ppo_config, [override], ConfigError) == expected
