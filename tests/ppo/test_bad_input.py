"""Bad configs and data stop main_ppo at start-up, before any worker starts, with a one-line cause.

The errors are checked in-process (the trainer's constructor raises a ``UserError`` whose
message is one line); one subprocess test checks what the command line prints and returns.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import base_overrides, compose_ppo, run_main_ppo
from one_line_errors import cli_refusal
from rlflow.errors import UserError
from rlflow.trainer.ppo_trainer import PPOTrainer


def start_up_error(overrides: list[str]) -> str:
    with pytest.raises(UserError) as info:
        PPOTrainer(compose_ppo(overrides))
    message = str(info.value)
    assert "\n" not in message, message
    return message


def write_malformed_rows(source, target) -> None:
    rows = pd.read_parquet(source).to_dict("records")
    rows[3]["prompt"] = "not a message list"
    target.write_text("\n".join(json.dumps(_plain(row)) for row in rows))


def test_missing_data_file(tiny_model, addition_data, tmp_path):
    message = start_up_error(base_overrides(tiny_model, addition_data, tmp_path) + [f"data.train_files=[{tmp_path / 'nope.parquet'}]"])
    assert "nope.parquet" in message


def test_malformed_row_names_file_row_and_field(tiny_model, addition_data, tmp_path):
    bad = tmp_path / "bad.jsonl"
    write_malformed_rows(addition_data / "train.parquet", bad)
    message = start_up_error(base_overrides(tiny_model, addition_data, tmp_path) + [f"data.train_files=[{bad}]"])
    assert "bad.jsonl" in message and "3" in message and "prompt" in message


def test_overlong_prompt_under_truncation_error(tiny_model, addition_data, tmp_path):
    message = start_up_error(base_overrides(tiny_model, addition_data, tmp_path) + ["data.max_prompt_length=4", "data.truncation=error"])
    assert "max_prompt_length" in message


def test_missing_model_folder(addition_data, tmp_path):
    assert "no_model" in start_up_error(base_overrides(tmp_path / "no_model", addition_data, tmp_path))


@pytest.mark.parametrize("key, extra", [
    ("critic.model.path", ["algorithm=ppo", "critic.ppo_mini_batch_size=2"]),
    ("reward.reward_model.path", ["reward.reward_model.enable=true"]),
])
def test_missing_value_model_folder_names_its_key(tiny_model, addition_data, tmp_path, key, extra):
    message = start_up_error(base_overrides(tiny_model, addition_data, tmp_path) + extra + [f"{key}={tmp_path / 'no_rm'}"])
    assert message.startswith(f"{key}: ") and "no_rm" in message


def test_combine_add_without_a_reward_model(tiny_model, addition_data, tmp_path):
    assert "reward.combine" in start_up_error(base_overrides(tiny_model, addition_data, tmp_path) + ["reward.combine=add"])


def test_mini_batch_that_does_not_divide_the_batch(tiny_model, addition_data, tmp_path):
    message = start_up_error(base_overrides(tiny_model, addition_data, tmp_path) + ["actor.ppo_mini_batch_size=3"])
    assert "actor.ppo_mini_batch_size" in message


def test_command_line_prints_one_line_and_exits_2(tiny_model, addition_data, tmp_path):
    bad = tmp_path / "bad.jsonl"
    write_malformed_rows(addition_data / "train.parquet", bad)
    result = run_main_ppo(base_overrides(tiny_model, addition_data, tmp_path) + [f"data.train_files=[{bad}]"], timeout=180)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "bad.jsonl" in error_lines[0], result.stderr[-2000:]


def _plain(value):
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


SEQUENCE_PARALLEL = ["actor.engine.ulysses_sequence_parallel_size=2", "actor.engine.attn_implementation=sdpa_varlen"]
TWO_NODES = ["trainer.nnodes=2", "trainer.n_procs_per_node=1", "trainer.ray_address=127.0.0.1:1"]  # never joined


@pytest.mark.parametrize("extra, expected", [
    (["actor.engine=megatron", "actor.engine.tensor_model_parallel_size=3"],
     "config key 'actor.engine': tensor_model_parallel_size=3 must divide num_key_value_heads=2"),
    (["actor.engine=megatron", "actor.engine.pipeline_model_parallel_size=2"],
     "config key 'actor.engine': tensor_model_parallel_size=1 x pipeline_model_parallel_size=2 must divide the 1 worker"),
    (["algorithm=ppo", "critic.ppo_mini_batch_size=2", "critic.engine=megatron", "critic.engine.pipeline_model_parallel_size=4"],
     "config key 'critic.engine': pipeline_model_parallel_size=4 is more stages than num_hidden_layers=3"),
    (TWO_NODES + ["actor.engine=megatron", "actor.engine.tensor_model_parallel_size=2"],
     "config key 'actor.engine': its groups of 2 ranks that exchange activations in every layer (tensor or sequence "
     "parallelism) would span nodes: trainer.n_procs_per_node=1 is not a multiple of 2"),
    (TWO_NODES + ["actor.engine=torchtitan", "actor.engine.tensor_parallel_size=2"],
     "config key 'actor.engine': its groups of 2 ranks that exchange activations in every layer"),
    (["algorithm=ppo", "critic.ppo_mini_batch_size=2", "critic.engine=torchtitan"],
     "config key 'critic.engine': engine 'torchtitan' does not support value_model"),
    (TWO_NODES + SEQUENCE_PARALLEL, "config key 'actor.engine': its groups of 2 ranks that exchange activations"),
    (SEQUENCE_PARALLEL, "config key 'actor.engine': ulysses_sequence_parallel_size=2 must divide the engine's 1 ranks"),
    (SEQUENCE_PARALLEL + ["trainer.n_procs_per_node=4", "trainer.cpus_per_proc=0.5",
                          "actor.engine.ulysses_sequence_parallel_size=4"],
     "config key 'actor.engine': ulysses_sequence_parallel_size=4 must divide the model's attention heads (4) and "
     "key/value heads (2)"),
    (["actor.engine.ulysses_sequence_parallel_size=2", "actor.engine.attn_implementation=sdpa"],
     "ulysses_sequence_parallel_size=2 needs use_remove_padding=true and attn_implementation in ['sdpa_varlen', "
     "'flash_attention_2', 'flash_attention_3']"),
    (SEQUENCE_PARALLEL + ["actor.engine.share_prefix=true"],
     "ulysses_sequence_parallel_size=2 cannot run with share_prefix=true"),
    (["actor.engine=megatron", "actor.engine.ulysses_sequence_parallel_size=2"],
     "config key 'actor.engine': engine 'megatron' does not support ulysses_sequence_parallel "
     "(ulysses_sequence_parallel_size=2; set it to 1 or use fsdp, fsdp2)"),
    (["algorithm=ppo", "critic.ppo_mini_batch_size=2", "critic.engine=megatron",
      "critic.engine.ulysses_sequence_parallel_size=2"],
     "config key 'critic.engine': engine 'megatron' does not support ulysses_sequence_parallel"),
    (["actor.engine=megatron", "actor.engine.sequence_parallel=true"],
     "sequence_parallel=true splits the sequence over the tensor-parallel ranks: it needs tensor_model_parallel_size > 1"),
    (["actor.engine=torchtitan", "actor.engine.pipeline_parallel_size=2"],
     "config key 'actor.engine': tensor_parallel_size=1 x pipeline_parallel_size=2 must divide the 1 ranks"),
    (["actor.engine=torchtitan", "actor.engine.pipeline_parallel_size=4", "trainer.n_procs_per_node=4",
      "trainer.cpus_per_proc=0.5"],
     "config key 'actor.engine': pipeline_parallel_size=4 is more stages than num_hidden_layers=3"),
    (["actor.engine=torchtitan", "actor.engine.pipeline_parallel_size=2", "actor.engine.tensor_parallel_size=2"],
     "tensor_parallel_size=2 with pipeline_parallel_size=2: the torchtitan engine runs one of the two at a time"),
    (["actor.engine=torchtitan", "actor.engine.pipeline_parallel_schedule=Interleaved1F1B"],
     "pipeline_parallel_schedule='Interleaved1F1B'"),
    (["actor.engine=torchtitan", "actor.engine.ulysses_sequence_parallel_size=2"],
     "config key 'actor.engine': engine 'torchtitan' does not support ulysses_sequence_parallel"),
    (["trainer.placement=split", "trainer.cpus_per_proc=0.5", "rollout.tensor_parallel_size=3"],
     "config key 'rollout.tensor_parallel_size': 3 ranks cannot split the model's 4 attention heads and 2 key/value heads"),
])
def test_an_engine_layout_the_model_or_world_cannot_take(tiny_model, addition_data, tmp_path, extra, expected):
    """Checked by the engine class (``BaseEngine.check_model``) on the model folder, before any worker starts."""
    assert expected in start_up_error(base_overrides(tiny_model, addition_data, tmp_path) + extra)


def test_a_colocated_tensor_parallel_rollout_is_one_line_before_ray(tmp_path):
    """A colocated worker holds one device, so ``rollout.tensor_parallel_size=2`` there exits 2 with the reason,
    within the refusal's CPU bound, Ray never started."""
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", "rollout.tensor_parallel_size=2",
                        f"trainer.ray_temp_dir={tmp_path / 'ray'}", f"trainer.default_local_dir={tmp_path / 'run'}"],
                       ray_dir=tmp_path / "ray")
    assert line.startswith("config key 'rollout.tensor_parallel_size': 2 shards need trainer.placement=split"), line
