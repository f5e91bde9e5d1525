"""Check a composed Hydra config against its dataclass schema.

Hydra YAML is untyped, so every entry point merges the composed config into the
structured schema. A misspelled key or a value of the wrong type then fails at
start-up with the full key name, and so does a number outside the range its schema
declares (``rlflow.config.ranges``). Sub-trees whose schema depends on a value (an
engine's options depend on ``engine.name``) are validated by a resolver that
returns the dataclass for that node.

verl's single-value forms are taken where verl takes them: a single value where the schema wants a
list of strings (``data.train_files=path``, ``trainer.logger=console``,
``lora.target_modules=all-linear``) is a one-item list. A single value where the schema wants any
other list, or a mapping, is one ``ConfigError`` line naming the form to write, never OmegaConf's
type error.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from typing import Any, Callable, Mapping, Union

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlflow.config.ranges import range_errors
from rlflow.errors import UserError

SubSchemaResolver = Callable[[DictConfig], type]


class ConfigError(UserError, ValueError):
    """A config value or key is wrong; the message names the full key and what to fix."""


def _describe(error: OmegaConfBaseException, prefix: str) -> str:
    key = getattr(error, "full_key", None) or ""
    full_key = f"{prefix}.{key}" if prefix and key else (prefix or key)
    message = str(error).split("\n")[0]
    return f"config key '{full_key}': {message}" if full_key else f"config error: {message}"


def _unwrap_optional(kind: Any) -> Any:
    """``Optional[X]`` -> ``X``; any other type as it is."""
    if typing.get_origin(kind) in (Union, types.UnionType):
        others = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return others[0] if len(others) == 1 else kind
    return kind


def _single_value_forms(schema: type, node: DictConfig, prefix: str) -> None:
    """Rewrite ``node`` in place: a single value under a list-of-strings field becomes a one-item list;
    under any other list or mapping field it is a ``ConfigError`` naming the form (see the module doc)."""
    hints = typing.get_type_hints(schema)
    for spec in dataclasses.fields(schema):
        if spec.name not in node or OmegaConf.is_interpolation(node, spec.name):
            continue
        value, kind = node[spec.name], _unwrap_optional(hints[spec.name])
        key = f"{prefix}.{spec.name}" if prefix else spec.name
        origin = typing.get_origin(kind)
        if dataclasses.is_dataclass(kind) and isinstance(value, DictConfig):
            _single_value_forms(kind, value, key)
        elif value is None or isinstance(value, (DictConfig, ListConfig)):
            continue
        elif origin is list and typing.get_args(kind) == (str,):
            node[spec.name] = [value]
        elif origin is list:
            raise ConfigError(f"config key '{key}': expected a list, got the single value {value!r}; write {key}=[a,b]")
        elif origin is dict:
            raise ConfigError(f"config key '{key}': expected a mapping, got the single value {value!r}; "
                              f"write {key}={{name: value}} or +{key}.name=value")


def _merge_into_schema(schema: type, node: Any, prefix: str) -> DictConfig:
    node = copy.deepcopy(node) if isinstance(node, DictConfig) else OmegaConf.create(node)
    _single_value_forms(schema, node, prefix)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
    except OmegaConfBaseException as error:
        raise ConfigError(_describe(error, prefix)) from None
    OmegaConf.set_struct(merged, True)
    return merged


def check_nodes(cfg: Any, schema: type, prefix: str = "") -> None:
    """Every key ``schema`` types as a dataclass is a mapping in the raw ``cfg``: not replaced by a value (``trainer=``
    on the command line) and, at the top level, not deleted (``~actor``); else one ``ConfigError`` line naming it."""
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        if not dataclasses.is_dataclass(hints[field.name]):
            continue
        key = f"{prefix}{field.name}"
        value = cfg.get(field.name) if isinstance(cfg, Mapping) else None
        if value is None and not prefix:
            raise ConfigError(f"config key '{key}': missing (deleted on the command line?); every run needs it: "
                              f"set the keys under it ({key}.NAME=VALUE) instead")
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"config key '{key}': holds keys ({key}.NAME=VALUE), not a value; got {value!r}")
        if value is not None:
            check_nodes(value, hints[field.name], f"{key}.")


def validate_config(
    cfg: DictConfig | dict,
    schema: type,
    sub_schemas: dict[str, SubSchemaResolver] | None = None,
) -> DictConfig:
    """Return ``cfg`` merged into ``schema`` (typed, struct-mode), raising ``ConfigError`` on a bad key or type.

    ``sub_schemas`` maps a dotted path (e.g. ``"actor.engine"``) to a resolver that
    picks the dataclass for that node from its contents. The schema field at such a
    path should be typed ``Any`` so the top-level merge leaves it alone.
    """
    merged = _merge_into_schema(schema, cfg, "")
    OmegaConf.set_struct(merged, False)
    node_schemas = {"": schema}
    for path, resolver in (sub_schemas or {}).items():
        node = OmegaConf.select(merged, path)
        if node is None:
            continue
        if not isinstance(node, DictConfig):
            raise ConfigError(f"config key '{path}': expected a mapping, got {node!r}")
        node_schemas[path] = resolver(node)
        typed = _merge_into_schema(node_schemas[path], node, path)
        OmegaConf.update(merged, path, typed, merge=False)
    OmegaConf.resolve(merged)
    OmegaConf.set_struct(merged, True)
    for path, node_schema in reversed(node_schemas.items()):  # engine nodes first: the root interpolates some of their keys
        check_ranges(OmegaConf.select(merged, path) if path else merged, node_schema, f"{path}." if path else "")
    return merged


def check_ranges(node: Any, schema: type, prefix: str = "") -> None:
    """Raise the ``ConfigError`` of the first value of ``node`` (a DictConfig, dict or dataclass) outside the range
    ``schema`` declares for it (``rlflow.config.ranges``); keys are named ``<prefix><field>``."""
    for message in range_errors(node, schema, prefix):
        raise ConfigError(message)
