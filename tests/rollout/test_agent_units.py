"""Units of the agent loops that need no engine: the trajectory's budget and masks, tool-response truncation,
the token-in turn encoder, and the pre-Ray checks of rows and tools."""

from __future__ import annotations

import pytest

from rlflow.config.multi_turn_schema import MultiTurnConfig
from rlflow.config.validation import ConfigError
from rlflow.rollout.agent.checks import check_agent_names, tool_schemas
from rlflow.rollout.agent.tool_agent import TRUNCATION_MARK, truncate_text
from rlflow.rollout.agent.trajectory import Trajectory
from rlflow.rollout.agent.turns import TurnEncoder
from rlflow.rollout.requests import Completion


def test_a_trajectory_keeps_masks_and_log_probs_aligned_and_never_outgrows_its_budget():
    trajectory = Trajectory([1, 2], budget=8)
    trajectory.add_model_turn([5, 6, 7], Completion((5, 6, 7, 9), (-0.5, -0.25, -0.125, -1.0), "stop"))
    assert trajectory.add_env_turn([20, 21])
    assert not trajectory.add_env_turn([30, 31, 32, 33]), "a turn that does not fit is refused whole"
    trajectory.add_model_turn([8, 9, 10, 11], Completion((8, 9, 10, 11), (-1.0, -2.0, -3.0, -4.0), "length"))
    assert trajectory.response_ids == [5, 6, 7, 20, 21, 8, 9, 10]
    assert trajectory.response_mask == [1, 1, 1, 0, 0, 1, 1, 1]
    assert trajectory.log_probs == [-0.5, -0.25, -0.125, 0.0, 0.0, -1.0, -2.0, -3.0]
    assert trajectory.truncated and trajectory.room == 0 and trajectory.ids == [1, 2, 5, 6, 7, 20, 21, 8, 9, 10]
    assert trajectory.metrics()["num_turns"] == 3.0


@pytest.mark.parametrize("side, expected", [
    ("left", TRUNCATION_MARK + "56789"), ("right", "01234" + TRUNCATION_MARK), ("middle", "01" + TRUNCATION_MARK + "789"),
])
def test_tool_responses_are_cut_on_the_configured_side(side, expected):
    limit = len(TRUNCATION_MARK) + 5
    assert truncate_text("0123456789" * 3, limit, side) == expected and len(expected) == limit
    assert truncate_text("short", limit, side) == "short"


def test_the_turn_encoder_appends_exactly_what_the_template_renders_after_an_assistant_turn(tokenizer):
    encoder = TurnEncoder(tokenizer, frozenset({tokenizer.eos_token_id}))
    turn = encoder.encode([{"role": "tool", "content": "408"}])
    assert tokenizer.decode(turn) == "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "call"}, {"role": "tool", "content": "408"}]
    whole = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert whole[-len(turn):] == turn


def test_rows_naming_loops_need_multi_turn_and_registered_names():
    check_agent_names(["", ""], MultiTurnConfig(), "data.train_files")  # no names: nothing to check
    with pytest.raises(ConfigError, match="data.train_files: rows name agent loops \\(tool_agent\\).*multi_turn.enable=true"):
        check_agent_names(["tool_agent"], MultiTurnConfig(), "data.train_files")
    with pytest.raises(ConfigError, match="data.val_files: unknown agent loop 'tool_agnet'"):
        check_agent_names(["tool_agnet"], MultiTurnConfig(enable=True), "data.val_files")


def test_tool_schemas_are_built_only_when_enabled_and_bad_options_are_config_errors():
    assert tool_schemas(MultiTurnConfig(tools=["calculator"])) == []
    schemas = tool_schemas(MultiTurnConfig(enable=True, tools=["calculator"]))
    assert [s["function"]["name"] for s in schemas] == ["calculator"] and schemas[0]["type"] == "function"
    with pytest.raises(ConfigError, match="tool_options"):
        tool_schemas(MultiTurnConfig(enable=True, tools=["calculator"], tool_options={"calculator": {"nope": 1}}))
