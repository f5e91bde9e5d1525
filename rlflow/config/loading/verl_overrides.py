"""Command-line keys in verl's spelling: one line naming rlflow's key, before Hydra or Ray start.

Hydra would answer ``actor_rollout_ref.actor.optim.lr=1e-6`` with its "use +key" hint, and the
``+`` form would then fail validation without saying what the key is called here. Every
override's key is looked up in the verl translation table (``rlflow.config.verl_keys``) unless it
is a key of rlflow's own schema, so a name both projects share is never refused.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterator, Sequence

from rlflow.config import ConfigError
from rlflow.config.schema import PPOConfig, SFTConfig
from rlflow.config.verl_keys import verl_key_message
from rlflow.engines.registry import EngineRegistry

ENTRY_SCHEMAS: dict[str, type] = {"ppo_trainer": PPOConfig, "sft_trainer": SFTConfig}


def _engine_config_classes() -> Iterator[type]:
    """Each engine's config class, imported one at a time: a key the first engines have stops the
    search there, so checking ``actor.engine.micro_batch_size`` never imports Megatron or torchtitan."""
    return (EngineRegistry.get(name).config_class for name in EngineRegistry.names())


def _has_key(schema: type, parts: list[str]) -> bool:
    """Whether the dotted key ``parts`` exists under the dataclass ``schema`` (an ``Any`` field: an engine node)."""
    if not parts:
        return True
    fields = {f.name: f for f in dataclasses.fields(schema)}
    if parts[0] not in fields:
        return False
    kind = typing.get_type_hints(schema)[parts[0]]
    rest = parts[1:]
    if kind is Any:
        return not rest or any(_has_key(config, rest) for config in _engine_config_classes())
    if dataclasses.is_dataclass(kind):
        return _has_key(kind, rest)
    return not rest or typing.get_origin(kind) is dict  # a free-form mapping takes any sub-key


def is_rlflow_key(entry: str, key: str) -> bool:
    """Whether ``key`` (dotted) is a key of ``entry``'s schema (``ppo_trainer`` or ``sft_trainer``)."""
    return _has_key(ENTRY_SCHEMAS[entry], key.split("."))


def override_key(arg: str) -> str | None:
    """The config key a command-line override sets (``+a.b=1`` -> ``a.b``); None for flags and group picks."""
    if arg.startswith("-") or "@" in arg.split("=")[0]:
        return None
    key, sep, _ = arg.partition("=")
    if not sep and not key.startswith("~"):
        return None
    return key.lstrip("~+") or None


def check_verl_overrides(entry: str, overrides: Sequence[str]) -> None:
    """Raise ``ConfigError`` for the first override whose key is verl's name and not rlflow's (entry points
    without a verl counterpart, such as the Tinker service, have nothing to check)."""
    if entry not in ENTRY_SCHEMAS:
        return
    for arg in overrides:
        key = override_key(arg)
        if key is None or is_rlflow_key(entry, key):
            continue
        message = verl_key_message(entry, key)
        if message is not None:
            raise ConfigError(message)
