"""What every Hydra entry point shares: the config folder, argv shorthands, in-process composition, one-line user errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from rlflow.config import ConfigError
from rlflow.config.loading.verl_overrides import check_verl_overrides
from rlflow.errors import UserError
from rlflow.utils.device import limit_cpu_threads

# The YAMLs ship inside the package (package data), so a wheel or non-editable install finds them too.
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")


# The group whose options are registered classes: a registered engine needs no YAML of its own.
ENGINE_GROUP = "engine"


def _group_key(group: str, mount: str) -> str:
    return group if mount == group else f"{group}@{mount}"


def _is_option_name(value: str) -> bool:
    return value.replace("_", "").isalnum()


def _engine_pick(key: str, value: str, group_mounts: Mapping[str, str]) -> str | None:
    """The mount whose engine ``key=value`` picks by name (``actor.engine=NAME``, ``actor.engine.name=NAME``)."""
    mount = key.removesuffix(".name")
    return mount if group_mounts.get(mount) == ENGINE_GROUP and _is_option_name(value) else None


def expand_group_shorthands(argv: list[str], group_mounts: Mapping[str, str]) -> list[str]:
    """Let users write ``actor.engine=fsdp`` for Hydra's ``engine@actor.engine=fsdp``.

    ``group_mounts`` maps a mount key (``actor.engine``) to its group (``engine``).
    Only bare option names are rewritten; ``actor.engine.lr=1e-5`` is left alone.

    ``actor.engine.name=NAME`` picks an engine just as ``actor.engine=NAME`` does (the last pick
    of a mount wins). An engine without ``rlflow/configs/engine/NAME.yaml`` (a plugin's) replaces the
    mount's default YAML with nothing: the node holds ``name`` and the keys set on the command
    line (force-added, ``++``), and the engine's config class supplies every other default when
    the config is validated.
    """
    picks = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        mount = _engine_pick(key, value, group_mounts) if sep else None
        if mount is not None:
            picks[mount] = value
    yamlless = {m for m, name in picks.items() if not (Path(CONFIG_DIR) / ENGINE_GROUP / f"{name}.yaml").is_file()}
    expanded = [f"~{_group_key(ENGINE_GROUP, mount)}" for mount in sorted(yamlless)]
    for arg in argv:
        key, sep, value = arg.partition("=")
        mount = _engine_pick(key, value, group_mounts) if sep else None
        under = next((m for m in yamlless if key.lstrip("+").startswith(f"{m}.")), None)
        if mount in yamlless:
            arg = f"++{mount}.name={picks[mount]}"
        elif mount is not None:
            arg = f"{_group_key(ENGINE_GROUP, mount)}={picks[mount]}"
        elif sep and under is not None:
            arg = f"++{arg.lstrip('+')}"
        elif sep and key in group_mounts and _is_option_name(value):
            arg = f"{_group_key(group_mounts[key], key)}={value}"
        expanded.append(arg)
    return expanded


def add_free_form_keys(argv: list[str], mappings: tuple[str, ...]) -> list[str]:
    """``++`` before each ``key=value`` that sets one of ``mappings`` (free-form nodes, such as the service's
    ``service.models``) or a key under it, so ``service.models.tiny=/path`` adds a key instead of failing Hydra's
    struct check, and ``service.models={org/name:/path}`` names keys that a dotted path cannot (a ``/``)."""
    expanded = []
    for arg in argv:
        key, sep, _ = arg.partition("=")
        key = key.lstrip("+")
        if sep and any(key == mapping or key.startswith(f"{mapping}.") for mapping in mappings):
            arg = f"++{arg.lstrip('+')}"
        expanded.append(arg)
    return expanded


def compose_hydra_config(config_name: str, overrides: Sequence[str], group_mounts: Mapping[str, str],
                         free_form_mappings: tuple[str, ...] = ()) -> DictConfig:
    """The raw config an entry point's Hydra parse gives for these command-line overrides, composed in-process;
    an override Hydra refuses (grammar, an unknown or empty group option) is one ``ConfigError`` line."""
    check_verl_overrides(config_name, overrides)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        try:
            return compose(config_name, add_free_form_keys(expand_group_shorthands(list(overrides), group_mounts),
                                                           free_form_mappings))
        except (HydraException, OmegaConfBaseException) as error:
            raise ConfigError(hydra_error_line(error, overrides)) from None


def hydra_error_line(error: Exception, overrides: Sequence[str]) -> str:
    """Hydra's multi-line refusal of a command line as one line: the override it could not parse and why, or its
    first line and the options of a group."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip() and not line.startswith("See https")]
    if isinstance(error, OverrideParseException):
        bad = next((arg for arg in overrides if not _parses(arg)), None)
        why = "; ".join(line for line in lines if not line.startswith("Error parsing override"))
        return f"command line: cannot parse the override {bad!r}: {why} (https://hydra.cc/docs/advanced/override_grammar/basic)"
    options = getattr(error, "options", None)
    choices = f"; choose one of {', '.join(options)}" if options else ""
    return f"command line: {lines[0] if lines else type(error).__name__}{choices}"


def _parses(override: str) -> bool:
    try:
        OverridesParser.create().parse_overrides([override])
    except OverrideParseException:
        return False
    return True


def check_command_line(config_name: str, argv: Sequence[str], group_mounts: Mapping[str, str],
                       free_form_mappings: tuple[str, ...] = ()) -> None:
    """Compose ``argv`` in-process first, so that what Hydra would refuse in many lines is one ``ConfigError``; a
    command line with flags (``--cfg job``, ``--help``) is left to Hydra, which reads them."""
    if any(arg.startswith("-") for arg in argv):
        check_verl_overrides(config_name, argv)
        return
    compose_hydra_config(config_name, argv, group_mounts, free_form_mappings)


def print_user_error(error: UserError) -> None:
    """``error:`` and the message on stderr, once per line (a check that lists several problems gives one line each)."""
    for line in str(error).splitlines() or [""]:
        print(f"error: {line}", file=sys.stderr)


def run_hydra_entry(
    config_name: str,
    run: Callable[[DictConfig], None],
    group_mounts: Mapping[str, str] | None = None,
    free_form_mappings: tuple[str, ...] = (),
) -> None:
    """Parse the command line with Hydra, then call ``run(cfg)``; ``UserError`` exits 2 with one line.

    Keys under ``free_form_mappings`` may be new (``add_free_form_keys``).

    A key in verl's spelling stops it first, with the line naming rlflow's key (``verl_overrides``), and so does
    anything else Hydra would refuse in many lines (``check_command_line``).

    The controller itself runs one torch thread: it only moves batches and does cheap batch math,
    and a second thread on a loaded small machine made its tensor work many times slower.
    """
    limit_cpu_threads(1)
    try:
        check_command_line(config_name, sys.argv[1:], group_mounts or {}, free_form_mappings)
    except UserError as error:
        print_user_error(error)
        sys.exit(2)
    argv = add_free_form_keys(expand_group_shorthands(sys.argv[1:], group_mounts or {}), free_form_mappings)
    sys.argv = [sys.argv[0], *argv]

    @hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base=None)
    def _main(cfg: DictConfig) -> None:
        try:
            run(cfg)
        except UserError as error:
            print_user_error(error)
            sys.exit(2)

    _main()
