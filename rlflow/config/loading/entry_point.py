"""One entry point's config, from the command line to a validated, typed config, before Ray starts.

An ``EntryPoint`` says what config loading needs to know of a Hydra entry point (``main_ppo``,
``main_sft``, the Tinker service): its YAML, its schema, where it mounts engines, its choice keys
and compute-dtype keys, and the checks of its own. The entry points themselves live above this
package (``rlflow/trainer/entry_points.py``, ``rlflow/service/config.py``) and hand in what only
they know (the placement and launcher registries, the service's key rules), so config loading
depends on no driver.

``EntryPoint.load`` runs every check in one order: plugins first (they may register names), then the
``auto`` speed settings (``auto_settings.py``: set from the run, before any key is typed), then keys and
types against the schema (each engine node against its engine's config class), every choice value,
what the policy engine supports, bf16/fp16 on this CPU, and last the entry point's own checks.
Numbers, the timeouts among them, are checked against their declared ranges with the keys and
types (``rlflow.config.ranges``). ``run`` then judges the machine (``machine_checks``) before the body
starts anything.

``--validate`` on the command line of any entry point runs ``load``, the machine checks and then the
entry point's ``preflight``: the rest of what its run checks before Ray starts (model and data files,
batch sizes against the ranks, the run folder), handed in by the driver so that this package imports
none. It prints the resolved config and exits 0, or prints the problem and exits 2; it starts no
Ray and writes nothing in the run folder. Hydra's ``--cfg job`` stays what it is: the composed
config, printed before any of these checks.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from rlflow.config import ConfigError, validate_config
from rlflow.config.validation import check_nodes
from rlflow.config.loading.auto_settings import RunKeys, settle_auto_settings
from rlflow.config.loading.choices import Choice, check_choices
from rlflow.config.loading.dtype_guard import ComputeDtypeKey, check_half_precision
from rlflow.config.loading.engine_checks import check_engine_supports, engine_schema_resolver
from rlflow.config.loading.hydra_entry import compose_hydra_config, run_hydra_entry
from rlflow.utils.plugins import import_plugins

# Keys naming plugins, in import order: rlflow's, then verl's spelling (merged into the first).
PLUGIN_KEYS = ("trainer.plugins", "trainer.external_lib")

ConfigCheck = Callable[[DictConfig], None]
VALIDATE_FLAG = "--validate"


@dataclass(frozen=True)
class EntryPoint:
    """What config loading knows of one Hydra entry point.

    ``engine_mounts`` are the keys where the ``engine`` group is mounted; ``policy_mounts`` the
    engines that train the policy (a causal LM) in every run, whose options (LoRA, mixed precision)
    are checked against the engine's capabilities. ``group_shorthands`` maps a mount key to its
    group (``actor.engine=fsdp`` for ``engine@actor.engine=fsdp``); keys under
    ``free_form_mappings`` may be new. ``choices`` and ``dtype_keys`` list the entry point's choice
    and compute-dtype keys (called after the plugins are imported); ``checks`` run last in ``load``.
    ``machine_checks`` judge what this machine or the cluster offers the run (CPUs, GPUs, a head that answers):
    ``run`` calls them after ``load``, before the body starts anything; a config composed in-process
    (``compose``) is not judged by the machine it is composed on. ``preflight`` is what ``--validate`` runs
    after those: the driver's own pre-Ray checks, which must start nothing and create nothing in the run
    folder (the run performs them on its way to Ray).
    """

    config_name: str
    schema: type
    choices: Callable[[], list[Choice]]
    dtype_keys: Callable[[], list[ComputeDtypeKey]]
    engine_mounts: tuple[str, ...] = ()
    policy_mounts: tuple[str, ...] = ()
    group_shorthands: Mapping[str, str] = field(default_factory=dict)
    free_form_mappings: tuple[str, ...] = ()
    checks: tuple[ConfigCheck, ...] = ()
    machine_checks: tuple[ConfigCheck, ...] = ()
    preflight: Optional[ConfigCheck] = None
    run_keys: RunKeys = RunKeys()

    def load(self, cfg: DictConfig) -> DictConfig:
        """Validate a composed (raw) config of this entry point; raises a ``UserError`` naming the bad key."""
        check_nodes(cfg, self.schema)
        cfg = settle_auto_settings(import_configured_plugins(cfg), self.engine_mounts, self.run_keys)
        config = validate_config(cfg, self.schema, {path: engine_schema_resolver(path) for path in self.engine_mounts})
        check_choices(config, self.choices())
        for mount in self.policy_mounts:
            if OmegaConf.select(config, mount) is None:
                raise ConfigError(f"config key '{mount}': missing (deleted on the command line?); the policy needs an "
                                  f"engine: pick one with {mount}=NAME")
            check_engine_supports(config, mount)
        check_half_precision(config, self.dtype_keys())
        for check in self.checks:
            check(config)
        return config

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        """The validated config this entry point builds from these command-line overrides, composed in-process."""
        return self.load(compose_hydra_config(self.config_name, overrides, self.group_shorthands, self.free_form_mappings))

    def check_machine(self, config: DictConfig) -> DictConfig:
        """Run the ``machine_checks`` on a validated config; returns it."""
        for check in self.machine_checks:
            check(config)
        return config

    def validate(self, cfg: DictConfig) -> DictConfig:
        """Every check a run makes before Ray starts (``load``, the machine, ``preflight``); returns the resolved config."""
        config = self.check_machine(self.load(cfg))
        if self.preflight is not None:
            self.preflight(config)
        return config

    def run(self, body: Callable[[DictConfig], object]) -> None:
        """Parse ``sys.argv`` with Hydra, validate, check the machine, then call ``body(config)``; a ``UserError`` exits 2
        with one line.

        With ``--validate`` anywhere in the arguments, ``body`` is not called: the resolved config
        is printed once ``validate`` passes (exit 0).
        """
        if VALIDATE_FLAG in sys.argv[1:]:
            sys.argv = [arg for arg in sys.argv if arg != VALIDATE_FLAG]
            run_hydra_entry(self.config_name, _print_resolved(self.validate), self.group_shorthands, self.free_form_mappings)
            return
        run_hydra_entry(self.config_name, lambda cfg: body(self.check_machine(self.load(cfg))), self.group_shorthands,
                        self.free_form_mappings)


def _print_resolved(validate: Callable[[DictConfig], DictConfig]) -> Callable[[DictConfig], None]:
    def validate_and_print(cfg: DictConfig) -> None:
        print(OmegaConf.to_yaml(validate(cfg)), end="")
        print("config valid: every pre-Ray check passed", file=sys.stderr)

    return validate_and_print


def _plugin_specs(cfg: DictConfig, key: str) -> list[str]:
    value: Any = OmegaConf.select(cfg, key)
    values = list(value) if isinstance(value, (ListConfig, list, tuple)) else [] if value is None else [value]
    if not all(isinstance(spec, str) for spec in values):
        raise ConfigError(f"config key '{key}': expected a module name or a path to a .py file (or a list of them), got {value!r}")
    return values


def import_configured_plugins(cfg: DictConfig) -> DictConfig:
    """Import the plugins a raw (not yet validated) config names; validation may need what they register.

    Returns a copy whose ``trainer.plugins`` lists every plugin imported (``.py`` paths made
    absolute, ``trainer.external_lib`` merged in and set to null), which is what the worker
    processes and ``torchrun`` ranks import in turn.
    """
    plugins = import_plugins([spec for key in PLUGIN_KEYS for spec in _plugin_specs(cfg, key)])
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.trainer.plugins = plugins
        cfg.trainer.external_lib = None
    return cfg
