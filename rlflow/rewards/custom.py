"""Loading a user's reward function from ``path/to/file.py:fn`` or ``package.module:fn``.

The function is called like every registered reward, ``fn(data_source, solution_str,
ground_truth, extra_info)``, and replaces the registry for every data_source (verl's
``custom_reward_function``). A file path is resolved against the current directory and imported
like a file plugin (``rlflow.utils.plugins.load_module_file``), so naming one file in both places
imports it once. Config loading loads it before Ray starts (``check_custom_function``): a module
that fails to import (``sys.exit`` and ``KeyboardInterrupt`` included) or a function with another
signature is one ``ConfigError`` line naming the file.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from rlflow.config import ConfigError
from rlflow.rewards.registry import RewardFn, RewardSignatureError, check_reward_signature
from rlflow.utils.plugins import load_module_file

_KEY = "reward.custom_function"


def load_custom_function(spec: str) -> RewardFn:
    """The callable named by ``spec``; raises ``ConfigError`` naming ``reward.custom_function`` and the problem."""
    location, sep, name = spec.rpartition(":")
    if not sep or not location or not name:
        raise ConfigError(f"config key {_KEY!r}: expected 'path/to/file.py:function' or 'package.module:function', got {spec!r}")
    module = _load_file(Path(location)) if location.endswith(".py") else _import(location)
    fn = getattr(module, name, None)
    if fn is None:
        raise ConfigError(f"config key {_KEY!r}: {location} has no attribute {name!r}")
    if not callable(fn):
        raise ConfigError(f"config key {_KEY!r}: {location}:{name} is a {type(fn).__name__}, not a function")
    try:
        return check_reward_signature(fn)
    except RewardSignatureError as error:
        raise ConfigError(f"config key {_KEY!r}: {error}") from None


def check_custom_function(config: Any) -> None:
    """Load ``reward.custom_function`` of a validated config, if set: the start-up check of the user's reward code."""
    spec: Optional[str] = OmegaConf.select(config, _KEY, default=None)
    if spec:
        load_custom_function(spec)


def _load_file(path: Path):
    path = path.expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"config key {_KEY!r}: file {path} does not exist")
    try:
        return load_module_file(path)
    except BaseException as error:  # noqa: BLE001 - sys.exit() or Ctrl-C in the user's module too: one line, exit 2
        raise ConfigError(f"config key {_KEY!r}: importing {path} failed: {_cause(error)}") from None


def _import(module_path: str):
    try:
        return importlib.import_module(module_path)
    except BaseException as error:  # noqa: BLE001 - sys.exit() or Ctrl-C in the user's module too: one line, exit 2
        raise ConfigError(f"config key {_KEY!r}: cannot import {module_path}: {_cause(error)}") from None


def _cause(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())
