"""Command-line keys in verl's spelling: one line each naming rlflow's key, all at once, before Hydra or Ray start.

Hydra would answer ``actor_rollout_ref.actor.optim.lr=1e-6`` with its "use +key" hint, and the
``+`` form would then fail validation without saying what the key is called here. Every
override's key is looked up in the verl translation table (``rlflow.config.verl_keys``) unless it
is a key of rlflow's own schema, so a name both projects share is never refused. verl's config-file
flags (``--config-path``, ``--config-name``) get a line of their own. Every such argument of a command
is reported in one error, one line each, so a verl command is fixed in one pass (or translated
whole by ``rlflow-from-verl``).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Iterator, Sequence

from rlflow.config import ConfigError
from rlflow.config.schema import PPOConfig, SFTConfig
from rlflow.config.verl_keys import GUIDE, verl_key_message
from rlflow.engines.registry import ENGINE_REGISTRY

ENTRY_SCHEMAS: dict[str, type] = {"ppo_trainer": PPOConfig, "sft_trainer": SFTConfig}
# Hydra's flags that pick a config file (verl scripts pass --config-path=config --config-name=ppo_megatron_trainer).
CONFIG_FILE_FLAGS = ("--config-path", "--config-name", "-cp", "-cn")
# verl config names with an rlflow spelling.
CONFIG_NAME_HINTS = {
    "ppo_megatron_trainer": " (verl's ppo_megatron_trainer is actor.engine=megatron ref.engine=megatron critic.engine=megatron)",
}


def _engine_config_classes() -> Iterator[type]:
    """Each engine's config class, imported one at a time: a key the first engines have stops the
    search there, so checking ``actor.engine.micro_batch_size`` never imports Megatron or torchtitan."""
    return (ENGINE_REGISTRY.get(name).config_class for name in ENGINE_REGISTRY.names())


_MISSING = object()


@functools.lru_cache(maxsize=None)
def _type_hints(schema: type) -> dict[str, Any]:
    """The fields of the dataclass ``schema`` and their types."""
    names = {spec.name for spec in dataclasses.fields(schema)}
    return {name: kind for name, kind in typing.get_type_hints(schema).items() if name in names}


def _field_type(schema: type, parts: list[str]) -> Any:
    """The annotated type of the dotted key ``parts`` under the dataclass ``schema`` (an ``Any`` field: an engine
    node, searched in each engine's config class); ``Any`` under a free-form mapping; ``_MISSING`` if no such key."""
    if not parts:
        return schema
    hints = _type_hints(schema)
    if parts[0] not in hints:
        return _MISSING
    kind = hints[parts[0]]
    rest = parts[1:]
    if kind is Any and rest:
        return next((found for config in _engine_config_classes() if (found := _field_type(config, rest)) is not _MISSING),
                    _MISSING)
    if dataclasses.is_dataclass(kind):
        return _field_type(kind, rest)
    if not rest:
        return kind
    return Any if typing.get_origin(kind) is dict else _MISSING  # a free-form mapping takes any sub-key


def field_type(entry: str, key: str) -> Any:
    """The type rlflow's schema declares for the dotted ``key`` of ``entry`` (``ppo_trainer`` / ``sft_trainer``);
    None when it has no such key."""
    found = _field_type(ENTRY_SCHEMAS[entry], key.split("."))
    return None if found is _MISSING else found


def is_rlflow_key(entry: str, key: str) -> bool:
    """Whether ``key`` (dotted) is a key of ``entry``'s schema (``ppo_trainer`` or ``sft_trainer``)."""
    return field_type(entry, key) is not None


def override_key(arg: str) -> str | None:
    """The config key a command-line override sets (``+a.b=1`` -> ``a.b``); None for flags and group picks."""
    if arg.startswith("-") or "@" in arg.split("=")[0]:
        return None
    key, sep, _ = arg.partition("=")
    if not sep and not key.startswith("~"):
        return None
    return key.lstrip("~+") or None


def verl_config_flag_message(flag: str, value: str) -> str | None:
    """The line for verl's Hydra config-file flags (``--config-path``, ``--config-name``); None for any other flag."""
    if flag not in CONFIG_FILE_FLAGS:
        return None
    hint = CONFIG_NAME_HINTS.get(value.strip("'\"").removesuffix(".yaml"), "")
    return (f"'{flag}' picks a config file; rlflow's entry points have one built-in config each (rlflow/configs/), so "
            f"set keys on the command line{hint}; rlflow-from-verl translates a verl command ({GUIDE})")


def verl_override_errors(entry: str, overrides: Sequence[str]) -> list[str]:
    """One line for each override whose key is verl's name and not rlflow's, and for each verl config-file flag
    (``--config-name=NAME`` or ``--config-name NAME``); entry points without a verl counterpart (the Tinker
    service) have none."""
    if entry not in ENTRY_SCHEMAS:
        return []
    errors = []
    for index, arg in enumerate(overrides):
        key = override_key(arg)
        if key is None:
            flag, sep, value = arg.partition("=")
            following = overrides[index + 1] if index + 1 < len(overrides) else ""
            message = verl_config_flag_message(flag, value if sep else following)
        else:
            message = None if is_rlflow_key(entry, key) else verl_key_message(entry, key)
        if message is not None:
            errors.append(message)
    return errors


def check_verl_overrides(entry: str, overrides: Sequence[str]) -> None:
    """Raise one ``ConfigError`` listing every verl key and config-file flag of ``overrides``, one line each."""
    errors = verl_override_errors(entry, overrides)
    if len(errors) > 1:
        errors.append(f"{len(errors)} verl keys or flags above; rlflow-from-verl translates a whole verl command ({GUIDE})")
    if errors:
        raise ConfigError("\n".join(errors))
