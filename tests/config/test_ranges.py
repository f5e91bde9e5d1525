"""Every numeric config key declares its range, and a value outside it is one line naming the key, before Ray.

The walk covers each entry point's schema and every registered engine's config class, so a new numeric
key without a range fails here; a dataclass with one undeclared field shows that the walk finds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

import pytest
from one_line_errors import cli_refusal, one_line_error

from rlflow.config import ConfigError
from rlflow.config.ranges import AT_LEAST_1, Range, undeclared_numeric_fields
from rlflow.config.schema import PPOConfig, SFTConfig
from rlflow.config.validation import check_ranges
from rlflow.engines.config import EngineConfigError, config_from_mapping
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.service.config import ServiceAppConfig
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config


@pytest.mark.parametrize("schema", [PPOConfig, SFTConfig, ServiceAppConfig])
def test_every_numeric_key_of_every_entry_point_declares_a_range(schema):
    assert undeclared_numeric_fields(schema) == [], "declare these keys' ranges in their dataclass's RANGES"


@pytest.mark.parametrize("engine", ENGINE_REGISTRY.names())
def test_every_numeric_key_of_every_engine_declares_a_range(engine):
    assert undeclared_numeric_fields(ENGINE_REGISTRY.get(engine).config_class) == []


@dataclass
class _Inner:
    steps: int = 1
    RANGES: ClassVar = {"steps": AT_LEAST_1}


@dataclass
class _Outer:
    name: str = "x"
    inner: _Inner = field(default_factory=_Inner)
    rate: Optional[float] = None  # no range declared
    sizes: list[int] = field(default_factory=list)  # no range declared
    RANGES: ClassVar = {}


def test_the_walk_finds_a_numeric_key_without_a_range():
    assert undeclared_numeric_fields(_Outer) == ["rate", "sizes"]
    assert undeclared_numeric_fields(_Inner) == []


def test_a_range_names_the_nested_key_and_reads_base_classes():
    with pytest.raises(ConfigError, match=r"^config key 'top.inner.steps': must be >= 1, got 0$"):
        check_ranges({"inner": {"steps": 0}}, _Outer, "top.")
    assert Range(0, 1, high_open=True).describe() == "in [0, 1)"
    assert not Range(0).contains(float("inf")) and not Range().contains(float("nan"))
    with pytest.raises(EngineConfigError, match=r"engine config key 'lora.dropout': must be in \[0, 1\), got 1.0"):
        config_from_mapping(ENGINE_REGISTRY.get("fsdp2").config_class, {"lora": {"dropout": 1.0}})


@pytest.mark.parametrize("override, message", [
    ("trainer.n_procs_per_node=0", "config key 'trainer.n_procs_per_node': must be >= 1, got 0"),
    ("rollout.n=0", "config key 'rollout.n': must be >= 1, got 0"),
    ("rollout.temperature=-1", "config key 'rollout.temperature': must be >= 0 (0: greedy), got -1.0"),
    ("data.max_response_length=0", "config key 'data.max_response_length': must be >= 1, got 0"),
    ("actor.clip_ratio=-0.2", "config key 'actor.clip_ratio': must be > 0, got -0.2"),
    ("actor.engine.optimizer.betas=[0.9,1.5]", "config key 'actor.engine.optimizer.betas': must be in [0, 1), got [0.9, 1.5]"),
    ("trainer.total_training_steps=-3", "config key 'trainer.total_training_steps': must be >= 1, got -3"),
    ("data.val_batch_size=-1", "config key 'data.val_batch_size': must be >= 1, got -1"),
    ("rollout.val_kwargs.top_k=0", "config key 'rollout.val_kwargs.top_k': must be -1 or >= 1 (-1: off), got 0"),
    ("algorithm.gamma=nan", "config key 'algorithm.gamma': must be in [0, 1], got nan"),
    ("rollout.stop=['']", "config key 'rollout': stop strings must be non-empty strings"),
    ("rollout.tensor_parallel_size=2", "config key 'rollout.tensor_parallel_size': 2 shards need trainer.placement=split, "
                                       "whose rollout workers reserve 2 devices each; a colocated worker holds one device"),
    ("rollout.name=hf rollout.tensor_parallel_size=2", "config key 'rollout.tensor_parallel_size': the hf rollout runs its "
                                                       "engine in one process, at tensor parallel size 1; got 2"),
])
def test_ppo_numbers_out_of_range_are_one_line_naming_the_key(override, message):
    assert one_line_error(compose_ppo_config, override.split()).startswith(message)


def test_sft_numbers_out_of_range_are_one_line_naming_the_key():
    assert one_line_error(compose_sft_config, ["engine.micro_batch_size=0"]) == \
        "config key 'engine.micro_batch_size': must be >= 1, got 0"


def test_the_cli_refuses_a_zero_divisor_in_one_line_before_ray(tmp_path):
    """``actor.ppo_mini_batch_size=0`` (like ``trainer.n_procs_per_node=0`` above) was a ZeroDivisionError traceback."""
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", "actor.ppo_mini_batch_size=0", f"trainer.ray_temp_dir={tmp_path / 'ray'}",
                        f"trainer.default_local_dir={tmp_path / 'run'}"], ray_dir=tmp_path / "ray")
    assert line == "config key 'actor.ppo_mini_batch_size': must be >= 1, got 0"
    assert not (tmp_path / "run").exists()

