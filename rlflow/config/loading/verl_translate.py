"""Translate a verl command into rlflow overrides, listing whatever could not be carried over and why.

``translate(command, device)`` takes the arguments ``read_verl_command`` found and returns a
``Translation``:

* every verl key goes through the key table (``rlflow.config.verl_keys``): a mapped key becomes
  rlflow's key, its value converted where the form differs (``verl_conversions``: warmup ratios to
  steps when the run's length is known, the KV cache fraction, engine picks, nested data columns),
  and a single value becomes a one-item list where rlflow's schema wants a list; a key rlflow has
  no equivalent for is **dropped** with the table's reason;
* Megatron keys, or verl's ``--config-name=ppo_megatron_trainer``, pick the megatron engine for
  the roles they configure;
* what verl would have taken without the script saying so is written out (**explicit**): the
  critic's and the reference's batch settings it inherits from the actor, the reward model's from
  the critic, and verl's defaults where rlflow's differ and change what the run computes
  (``EXPLICIT``). Defaults that only size memory or speed (dtypes, compile, checkpointing) are
  left to rlflow's own, whose reasons docs/from_verl.md gives.
"""

from __future__ import annotations

import re
import shlex
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from rlflow.config.loading.verl_args import ACTOR, REF, VerlArgs
from rlflow.config.loading.verl_conversions import Conversion, Unmappable, conversion_for
from rlflow.config.loading.verl_overrides import field_type, is_rlflow_key
from rlflow.config.verl_keys import find_row, rlflow_key, verl_key_message
from rlflow.config.verl_script import VerlCommand

ENTRY_COMMANDS = {"ppo_trainer": "rlflow-ppo", "sft_trainer": "rlflow-sft"}
MEGATRON_CONFIG_NAMES = {"ppo_megatron_trainer"}
# verl's prefix of each role's Megatron keys -> the rlflow engine mount they configure.
MEGATRON_MOUNTS = {f"{ACTOR}megatron.": "actor.engine", f"{REF}megatron.": "ref.engine", "critic.megatron.": "critic.engine",
                   "reward_model.megatron.": "reward.reward_model.engine"}
CONFIG_FILE_FLAGS = ("--config-path", "--config-name", "-cp", "-cn")
_SAFE_WORD = re.compile(r"[A-Za-z0-9_./+\-@%:]+")
_parser = OverridesParser.create()


def _always(args: VerlArgs) -> bool:
    return True


def _dynamic(prefix: str) -> Callable[[VerlArgs], bool]:
    return lambda args: bool(args.value(f"{prefix}use_dynamic_bsz"))


# verl keys whose value (the script's, else verl's default or inherited one) is written out when the script leaves the key
# out: (verl key, when, why).
EXPLICIT: dict[str, list[tuple[str, Callable[[VerlArgs], bool], str]]] = {
    "ppo_trainer": [
        ("algorithm.adv_estimator", _always, "verl's default gae (rlflow's: grpo)"),
        ("data.max_prompt_length", _always, "verl's default"),
        ("data.max_response_length", _always, "verl's default"),
        ("data.train_batch_size", _always, "verl's default"),
        (f"{ACTOR}ppo_mini_batch_size", _always, "verl's default"),
        (f"{ACTOR}shuffle", _always, "verl's default: mini-batches in order"),
        (f"{ACTOR}ppo_max_token_len_per_gpu", _dynamic(ACTOR), "verl's default token budget"),
        ("actor_rollout_ref.rollout.n", _always, "verl's default: one response per prompt"),
        ("trainer.total_epochs", _always, "verl's default"),
        ("trainer.device", lambda args: args.device == "cuda", "verl's default, the device this translation is for"),
        ("critic.ppo_mini_batch_size", lambda args: args.uses_critic, "verl's critic takes the actor's"),
        ("critic.ppo_epochs", lambda args: args.uses_critic, "verl's critic takes the actor's"),
        ("critic.shuffle", lambda args: args.uses_critic, "verl's critic takes the actor's"),
        ("critic.loss_agg_mode", lambda args: args.uses_critic, "verl's critic takes the actor's"),
        ("critic.use_dynamic_bsz", lambda args: args.uses_critic and _dynamic("critic.")(args), "verl's critic takes the actor's"),
        ("critic.ppo_max_token_len_per_gpu", lambda args: args.uses_critic and _dynamic("critic.")(args), "verl's default"),
        ("critic.optim.lr", lambda args: args.uses_critic, "verl's default critic learning rate"),
        (f"{REF}strategy", lambda args: args.uses_reference and args.has(f"{ACTOR}strategy"),
         "verl's reference takes the actor's strategy"),
        (f"{REF}log_prob_use_dynamic_bsz", lambda args: args.uses_reference and _dynamic(f"{REF}log_prob_")(args),
         "verl's reference takes the actor's"),
        (f"{REF}log_prob_max_token_len_per_gpu", lambda args: args.uses_reference and _dynamic(f"{REF}log_prob_")(args),
         "verl's reference takes the actor's"),
        ("reward_model.use_dynamic_bsz", lambda args: args.value("reward_model.enable") and _dynamic("reward_model.")(args),
         "verl's reward model takes the critic's"),
        ("reward_model.forward_max_token_len_per_gpu",
         lambda args: args.value("reward_model.enable") and _dynamic("reward_model.")(args), "verl's reward model takes the critic's"),
    ],
    "sft_trainer": [
        ("data.train_batch_size", _always, "verl's default"),
        ("data.max_length", _always, "verl's default"),
        ("data.prompt_key", lambda args: not args.value("data.multiturn.enable"), "verl's default pair columns"),
        ("data.response_key", lambda args: not args.value("data.multiturn.enable"), "verl's default pair columns"),
        ("optim.lr", _always, "verl's default"),
        ("optim.betas", _always, "verl's default"),
        ("optim.weight_decay", _always, "verl's default"),
        ("optim.lr_warmup_steps_ratio", _always, "verl's default warmup"),
        ("optim.min_lr_ratio", _always, "verl's default"),
        ("trainer.total_epochs", _always, "verl's default"),
        ("trainer.device", lambda args: args.device == "cuda", "verl's default, the device this translation is for"),
    ],
}


@dataclass
class Translation:
    """An rlflow command for a verl one: its entry point, overrides, and notes on everything that changed on the way."""

    entry: str
    overrides: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # "verl arg: why, and what to do"
    converted: list[str] = field(default_factory=list)  # "verl arg -> rlflow override: how"
    explicit: list[str] = field(default_factory=list)  # "rlflow override: why (verl's inherited value or default)"

    @property
    def command(self) -> str:
        return ENTRY_COMMANDS[self.entry]

    def script(self, source: str) -> str:
        """The translation as a runnable shell script: the notes as comments, then the command."""
        lines = [f"# {self.command}, translated by rlflow-from-verl from {source}"]
        for title, notes in (("not carried over (verl's argument: why)", self.dropped),
                             ("converted", self.converted),
                             ("made explicit (what verl would have taken without the script saying so)", self.explicit)):
            if notes:
                lines += [f"# {title}:"] + [f"#   {note}" for note in notes]
        words = [shlex.quote(override) for override in self.overrides]
        return "\n".join(lines + [" \\\n    ".join([self.command, *words])]) + "\n"


def render_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (quoted where an unquoted form would read as something else)."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{render_value(item)}" for key, item in value.items()) + "}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _SAFE_WORD.fullmatch(text) and _parser.parse_override(f"k={text}").value() == text:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def guess_entry(keys: list[str]) -> str:
    """``sft_trainer`` when the keys are verl's SFT ones (``optim.*``, ``model.partial_pretrain``), else ``ppo_trainer``."""
    sft = any(key.startswith(("optim.", "model.partial_pretrain", "data.micro_batch_size")) for key in keys)
    return "sft_trainer" if sft and not any(key.startswith("actor_rollout_ref.") for key in keys) else "ppo_trainer"


class _Translator:
    def __init__(self, command: VerlCommand, entry: str, device: str):
        self.command, self.entry = command, entry
        self.result = Translation(entry)
        self.values: dict[str, Any] = {}
        self.args = VerlArgs(entry, {}, device)
        self.parsed: list[tuple[int, str, str, Any]] = []  # (arg index, arg, verl key, value)

    def read(self) -> None:
        """Parse every argument; flags and unreadable ones are dropped with their reason."""
        args = self.command.args
        skip = False
        for index, arg in enumerate(args):
            if skip:
                skip = False
                continue
            flag, sep, value = arg.partition("=")
            if flag in CONFIG_FILE_FLAGS:
                skip = not sep
                value = value if sep else (args[index + 1] if index + 1 < len(args) else "")
                self._config_flag(flag, value.strip("'\"").removesuffix(".yaml"))
                continue
            if index in self.command.unresolved:
                names = ", ".join(self.command.unresolved[index])
                self.result.dropped.append(f"{arg}: uses {names}, which only the script's own arguments or environment set; "
                                           f"add the key to the rlflow command with its value")
                continue
            try:
                override = _parser.parse_override(arg)
            except HydraException as error:
                self.result.dropped.append(f"{arg}: not a key=value override ({str(error).splitlines()[0]})")
                continue
            if override.is_delete() or override.is_sweep_override():
                self.result.dropped.append(f"{arg}: a Hydra delete or sweep; give rlflow one value")
                continue
            self.parsed.append((index, arg, override.key_or_group, override.value()))
            self.args.given[override.key_or_group] = override.value()

    def _config_flag(self, flag: str, value: str) -> None:
        if flag in ("--config-name", "-cn"):
            self.args.config_name = value
        if value in MEGATRON_CONFIG_NAMES:
            self.result.converted.append(f"{flag}={value} -> the megatron engine for every role")
        else:
            self.result.dropped.append(f"{flag}={value}: rlflow's entry points have one built-in config each")

    def map_all(self) -> None:
        for _, arg, key, value in self.parsed:
            self._map(arg, key, value, None)
        for key, when, why in EXPLICIT[self.entry]:
            if not self.args.has(key) and when(self.args):
                value = self.args.value(key)
                self._map(f"{key}={render_value(value)} (verl's default; rlflow's own applies)", key, value, why)
        self._launcher()
        self._megatron_picks()

    def _launcher(self) -> None:
        """torchrun's process counts become rlflow's (its workers are started by the entry point itself)."""
        launcher = self.command.launcher
        if "torchrun" not in " ".join(launcher):
            return
        options = dict(word.lstrip("-").replace("-", "_").partition("=")[::2] for word in launcher if word.startswith("--"))
        for option, key in (("nnodes", "trainer.nnodes"), ("nproc_per_node", "trainer.n_procs_per_node")):
            value = options.get(option, "")
            if value.isdigit() and key not in self.values:
                self.values[key] = int(value)
                self.result.converted.append(f"torchrun --{option}={value} -> {key}={value}")
            elif option in options and key not in self.values:
                self.result.dropped.append(f"torchrun --{option}={value}: not a number here; set {key} (rlflow-sft starts "
                                           f"its workers itself, or runs under torchrun with trainer.launcher=torchrun)")

    def _map(self, arg: str, key: str, value: Any, why: Optional[str]) -> None:
        row = find_row(self.entry, key)
        ours = rlflow_key(row, key) if row is not None else key if is_rlflow_key(self.entry, key) else None
        if ours is None:
            reason = row[2] if row is not None else verl_key_message(self.entry, key) or "neither verl's key table nor rlflow's schema has it"
            self.result.dropped.append(f"{arg}: {reason or 'rlflow has no equivalent'}")
            return
        converter = conversion_for(key) if row is not None else None
        try:
            conversion = converter(self.args, key, ours, value) if converter else Conversion([(ours, value)])
        except Unmappable as reason:
            self.result.dropped.append(f"{arg}: {reason}")
            return
        written, listed = [], False
        for target, target_value in conversion.pairs:
            if why is not None and target in self.values:
                continue  # the script's own keys set it (verl's min_lr sets what min_lr_ratio's default would)
            target_value, as_list = self._list_form(target, target_value)
            listed |= as_list
            self.values.pop(target, None)
            self.values[target] = target_value
            written.append(f"{target}={render_value(target_value)}")
        if why is not None:
            self.result.explicit += [f"{override}: {why}" for override in written]
        elif written and (conversion.note or listed):
            self.result.converted.append(f"{arg} -> {' '.join(written)}: {conversion.note or 'a one-item list'}")
        elif conversion.note:
            self.result.converted.append(f"{arg}: {conversion.note}")

    def _list_form(self, key: str, value: Any) -> tuple[Any, bool]:
        """A single value where rlflow's schema wants a list, as a one-item list."""
        kind = field_type(self.entry, key)
        wants_list = getattr(kind, "__origin__", None) is list
        return ([value], True) if wants_list and not isinstance(value, (list, tuple)) and value is not None else (value, False)

    def _megatron_picks(self) -> None:
        if self.entry != "ppo_trainer":
            return
        in_use = {"actor.engine": True, "ref.engine": self.args.uses_reference, "critic.engine": self.args.uses_critic,
                  "reward.reward_model.engine": bool(self.args.value("reward_model.enable"))}
        whole_config = self.args.config_name in MEGATRON_CONFIG_NAMES
        mounts = {mount for prefix, mount in MEGATRON_MOUNTS.items()
                  if whole_config or any(key.startswith(prefix) for key in self.args.given)}
        for mount in sorted(mount for mount in mounts - set(self.values) if in_use[mount]):
            self.values = {mount: "megatron", **self.values}
            self.result.explicit.append(f"{mount}=megatron: the script configures verl's Megatron workers for this role")

    def _overrides(self, key: str, value: Any) -> list[str]:
        """``key=value`` in Hydra's form: a key under a free-form mapping (``rollout.engine_kwargs``) is added with ``++``,
        and a mapping value for one is written one entry at a time."""
        if typing.get_origin(field_type(self.entry, key)) is dict and isinstance(value, dict):
            return [f"++{key}.{sub}={render_value(item)}" for sub, item in value.items()]
        parent = key.rpartition(".")[0]
        under_mapping = bool(parent) and typing.get_origin(field_type(self.entry, parent)) is dict
        return [f"{'++' if under_mapping else ''}{key}={render_value(value)}"]

    def finish(self) -> Translation:
        self.result.overrides = [override for key, value in self.values.items() for override in self._overrides(key, value)]
        return self.result


def translate(command: VerlCommand, device: str, entry: Optional[str] = None) -> Translation:
    """The rlflow overrides for a verl command (see the module doc); ``device`` (cpu | cuda) is where the run goes."""
    keys = [arg.lstrip("+~").partition("=")[0] for arg in command.args]
    translator = _Translator(command, entry or command.entry or guess_entry(keys), device)
    translator.read()
    translator.map_all()
    return translator.finish()
