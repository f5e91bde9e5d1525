"""No verl key is accepted and then ignored: every mapped row of the key table carries its value to the config node
the code reads, and that node has a reader.

The walk sets each mapped verl key to a value unlike rlflow's default (a distinctive value of the field's type, or
another legal name for a choice key), translates it with rlflow-from-verl, loads the result as ``main_ppo`` /
``main_sft`` would, and checks the value sits at the rlflow key the table names. Keys whose value changes form on
the way (``verl_conversions``) are checked against verl's rule worked out by hand (``SPECIAL``). Keys share one load
where they set different rlflow keys and need the same engines. ``CONSUMED_IN`` names, for every rlflow key a verl key
maps to, the file whose code reads it; the test checks the key is listed and that file reads that name.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
from omegaconf import OmegaConf
from verl_key_readers import CONSUMED_IN

from rlflow.config.loading.verl_overrides import field_type
from rlflow.config.loading.verl_translate import render_value, translate
from rlflow.config.verl_keys import find_row, rlflow_key, rows
from rlflow.config.verl_script import VerlCommand
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.trainer.entry_points import PPO_ENTRY, SFT_ENTRY
from rlflow.utils.registry import Registry

REPO = Path(__file__).resolve().parents[2]
ENTRIES = {"ppo_trainer": PPO_ENTRY, "sft_trainer": SFT_ENTRY}
MOUNT = re.compile(r"^((?:actor|critic|ref|reward\.reward_model)\.engine|engine)\.(.+)$")
ENGINE_ORDER = ("fsdp2", "fsdp", "megatron")  # the first that has a key serves it (fsdp2: every mount's default)
ACTOR, OPTIM = "actor_rollout_ref.actor.", "actor_rollout_ref.actor.optim."

# verl keys (by their end) whose value changes form: (extra verl arguments, the value set, the value rlflow must hold).
# Warmup: verl warms over int(0.3 x 10 steps) = 3 of its once-per-step schedule's steps; rlflow steps per update,
# 8 prompts / 2 per mini-batch = 4 a step in PPO (12), one a step in SFT (3).
# Rollout correction's keys with the keys its start-up check wants beside them.
CORRECTION, LOG_PROBS = "algorithm.rollout_correction.", "actor_rollout_ref.rollout.calculate_log_probs=True"
BYPASS_CONTEXT = [LOG_PROBS, f"{ACTOR}policy_loss.loss_mode=vanilla"]  # bypass mode replaces a vanilla loss only
WARMUP_CONTEXT = ["trainer.total_training_steps=10", "data.train_batch_size=8", f"{ACTOR}ppo_mini_batch_size=2"]
WALK_REWARD = str(Path(__file__).with_name("walk_reward.py"))  # config loading imports it and checks the functions
SPECIAL: dict[str, tuple[list[str], Any, dict[str, Any]]] = {
    "hybrid_engine": ([], False, {"ppo_trainer": "split"}),
    "custom_reward_function.path": ([], WALK_REWARD, {"ppo_trainer": f"{WALK_REWARD}:compute_score"}),
    "custom_reward_function.name": ([f"custom_reward_function.path={WALK_REWARD}"], "walk_fn",
                                    {"ppo_trainer": f"{WALK_REWARD}:walk_fn"}),
    "multi_turn.format": ([], "hermes", {"ppo_trainer": "hermes"}),  # the one format registered: no other to walk with
    "trainer.resume_mode": ([], "resume_path", {"ppo_trainer": "path", "sft_trainer": "path"}),
    "trainer.resume_from_path": (["trainer.resume_mode=resume_path"], "/walk/ckpt",  # read under resume_path only
                                 {"ppo_trainer": "/walk/ckpt", "sft_trainer": "/walk/ckpt"}),
    "lr_warmup_steps_ratio": (WARMUP_CONTEXT, 0.3, {"ppo_trainer": 12, "sft_trainer": 3}),
    "lr_warmup_steps": ([], 7, {"ppo_trainer": 7, "sft_trainer": 7}),
    "optim.total_training_steps": ([], 9, {"ppo_trainer": 9, "sft_trainer": 9}),
    "min_lr": (["<optim>lr=2e-6"], 1e-7, {"ppo_trainer": 1e-7 / 2e-6, "sft_trainer": 1e-7 / 2e-6}),
    "fsdp_size": (["trainer.n_gpus_per_node=8"], 4, {"ppo_trainer": 2, "sft_trainer": 2}),  # 8 ranks / shards of 4
    "recompute_granularity": ([], "full", {"ppo_trainer": True}),
    "rollout.gpu_memory_utilization": ([], 0.37, {"ppo_trainer": 0.37}),
    "rollout.tensor_model_parallel_size": ([], 1, {"ppo_trainer": 1}),  # rlflow's only size: nothing else to carry
    "ulysses_sequence_parallel_size": (["<padding>=True"], 2, {"ppo_trainer": 2, "sft_trainer": 2}),  # + sdpa_varlen
    "megatron.sequence_parallel": (["<megatron>tensor_model_parallel_size=2"], True, {"ppo_trainer": True}),  # TP > 1
    "prompt_dict_keys": (["data.prompt_key=walk_col"], ["a", "b"], {"sft_trainer": "walk_col.a.b"}),
    "response_dict_keys": (["data.response_key=walk_col"], ["c"], {"sft_trainer": "walk_col.c"}),
    "lora_adapter_path": ([f"{ACTOR[:-6]}model.lora_rank=0"], "/walk/adapter", {"ppo_trainer": "/walk/adapter"}),  # a folder is read at rank > 0
    "trainer.device": ([], "cuda", {"ppo_trainer": "cuda", "sft_trainer": "cuda"}),
    "strategy": ([], "fsdp", {"ppo_trainer": "fsdp", "sft_trainer": "fsdp"}),  # an engine pick: <mount>=fsdp
    "policy_loss.loss_mode": ([], "gspo", {"ppo_trainer": "gspo"}),  # not bypass_mode: rollout correction's bypass picks it
    "rollout_correction.rollout_is": ([LOG_PROBS], "sequence", {"ppo_trainer": "sequence"}),
    "rollout_correction.rollout_is_threshold": ([], 3.0, {"ppo_trainer": 3.0}),  # a legal one, checked with rollout_is
    "rollout_correction.rollout_rs": ([LOG_PROBS, f"{CORRECTION}rollout_rs_threshold=0.5"], "seq_mean_k3",
                                      {"ppo_trainer": "seq_mean_k3"}),
    "rollout_correction.rollout_rs_threshold": ([LOG_PROBS, f"{CORRECTION}rollout_rs=token_k2"], 0.37, {"ppo_trainer": 0.37}),
    "rollout_correction.bypass_mode": (BYPASS_CONTEXT, True, {"ppo_trainer": True}),
    "rollout_correction.loss_type": (BYPASS_CONTEXT + [f"{CORRECTION}bypass_mode=True"], "reinforce",
                                     {"ppo_trainer": "reinforce"}),
    "async_training.require_batches": (["data.train_batch_size=8"], 4, {"ppo_trainer": 4}),  # divides the batch
    "async_training.partial_rollout": (["async_training.mode=fully_async", "trainer.hybrid_engine=False"], True,
                                       {"ppo_trainer": True}),  # a fully_async key, on split placement
}
# Ulysses needs remove-padding on its role: verl's key for it by the role's prefix (the reference keeps rlflow's default)
REMOVE_PADDING = {"actor_rollout_ref.actor.": "actor_rollout_ref.model.use_remove_padding",
                  "critic.": "critic.model.use_remove_padding", "actor_rollout_ref.ref.": None}


def _placeholders(verl: str, context: list[str]) -> list[str]:
    """``context`` with ``<optim>`` / ``<megatron>`` (the key's optimizer / megatron section) and ``<padding>`` (its
    role's remove-padding key)."""
    optim = verl[: verl.rindex("optim.") + len("optim.")] if "optim." in verl else ""
    megatron = verl[: verl.rindex("megatron.") + len("megatron.")] if "megatron." in verl else ""
    padding = next((key for prefix, key in REMOVE_PADDING.items() if verl.startswith(prefix)), "use_remove_padding")
    places = {"<optim>": optim, "<megatron>": megatron, "<padding>": padding or ""}
    filled = []
    for arg in context:
        if arg.startswith("<padding>") and padding is None:
            continue
        for place, value in places.items():
            arg = arg.replace(place, value)
        filled.append(arg)
    return filled


# Where a value lands when that is not the table's rlflow key: config loading merges verl's external_lib into plugins.
LANDS_IN = {"trainer.external_lib": "trainer.plugins"}


@dataclass
class Probe:
    """One verl key set to a distinctive value, and where and what rlflow must hold for it."""

    verl: str
    ours: str
    value: Any
    expected: Any
    context: list[str] = field(default_factory=list)
    engine: Optional[tuple[str, str]] = None  # (mount, engine name) the key needs
    context_targets: set[str] = field(default_factory=set)  # the rlflow keys the context sets

    @property
    def mount(self) -> Optional[str]:
        match = MOUNT.match(self.ours)
        return match.group(1) if match else None


def _has(config_class: type, parts: list[str]) -> bool:
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    if parts[0] not in fields:
        return False
    kind = typing.get_type_hints(config_class)[parts[0]]
    return len(parts) == 1 or (dataclasses.is_dataclass(kind) and _has(kind, parts[1:]))


def engine_needed(ours: str, verl: str) -> Optional[tuple[str, str]]:
    """(mount, engine) for an engine key that not both fsdp engines have (fsdp2's compile, fsdp's forward_prefetch,
    megatron's TP); None for a key every HF-module engine has."""
    match = MOUNT.match(ours)
    if match is None:
        return None
    mount, rest = match.groups()
    if ".megatron." in verl:  # a key of verl's <role>.megatron. configures its Megatron worker: the translation picks it
        return mount, "megatron"
    if rest == "name":
        return mount, "fsdp"  # verl's strategy=fsdp picks the fsdp engine
    serving = [name for name in ENGINE_ORDER if _has(ENGINE_REGISTRY.get(name).config_class, rest.split("."))]
    return None if {"fsdp", "fsdp2"} <= set(serving) else (mount, serving[0])


def engine_default(ours: str) -> Any:
    match = MOUNT.match(ours)
    name = next(name for name in ENGINE_ORDER if _has(ENGINE_REGISTRY.get(name).config_class, match.group(2).split(".")))
    node = OmegaConf.structured(ENGINE_REGISTRY.get(name).config_class)
    return OmegaConf.select(node, match.group(2))


def choice_names(entry: str) -> dict[str, list[str]]:
    table = {}
    for choice in ENTRIES[entry].choices():
        names = choice.names.names() if isinstance(choice.names, Registry) else choice.names
        table[choice.key] = sorted(names)
    return table


def distinctive(entry: str, ours: str, default: Any, choices: dict[str, list[str]]) -> Any:
    """A legal value of ``ours`` unlike ``default``."""
    kind = field_type(entry, ours)
    args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    kind = args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind
    if ours in choices:
        other = [name for name in choices[ours] if name not in (default if isinstance(default, list) else [default])][0]
        return [other] if typing.get_origin(kind) is list else other
    if kind is bool:
        return not default
    if kind is int:
        return (default or 0) + 3
    if kind is float:
        return 0.37 if not default else default * 0.5 + 0.0123
    if typing.get_origin(kind) is list:
        return [0.8, 0.95] if typing.get_args(kind) == (float,) else ["walk-item"]
    if typing.get_origin(kind) is dict or kind is Any:
        return {"walk": 1}
    return f"walk-{ours.rsplit('.', 1)[-1]}"


def probes(entry: str) -> list[Probe]:
    defaults = ENTRIES[entry].compose([])
    choices = choice_names(entry)
    found = []
    for verl, ours, _ in rows(entry):
        if verl is None or ours is None:
            continue
        if verl.endswith(".*"):  # a prefix row: one key below it
            verl, ours = verl[:-1] + "walk_key", ours[:-1] + "walk_key"
            found.append(Probe(verl, ours, 16, 16))
            continue
        special = next((spec for end, spec in SPECIAL.items() if verl == end or verl.endswith("." + end)), None)
        if special is not None:
            context, value, expected = special
            context = _placeholders(verl, context)
            targets = {rlflow_key(find_row(entry, key), key) for key in (arg.split("=")[0] for arg in context) if find_row(entry, key)}
            found.append(Probe(verl, ours, value, expected[entry], context, engine_needed(ours, verl), targets))
            continue
        default = OmegaConf.select(defaults, ours, default=None) if not MOUNT.match(ours) or OmegaConf.select(
            defaults, ours, default="missing") != "missing" else engine_default(ours)
        default = OmegaConf.to_container(default) if OmegaConf.is_config(default) else default
        value = distinctive(entry, ours, default, choices)
        found.append(Probe(verl, LANDS_IN.get(ours, ours), "json" if verl.endswith("external_lib") else value,
                           "json" if verl.endswith("external_lib") else value, engine=engine_needed(ours, verl)))
    return found


def _context_keys(probe: Probe) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in probe.context)


def _fits(probe: Probe, group: list[Probe]) -> bool:
    """Whether ``probe`` can share a load with ``group``: no rlflow key (or a node above one) set twice, no verl key
    both set and used as another's context, one engine per mount, and a megatron mount to itself."""
    contexts = {key: value for other in group for key, value in _context_keys(other).items()}
    for other in group:
        if probe.verl == other.verl or probe.ours == other.ours or other.ours.startswith(probe.ours + ".") \
                or probe.ours.startswith(other.ours + "."):
            return False
    if any(other.ours in probe.context_targets or probe.ours in other.context_targets for other in group):
        return False
    mine = _context_keys(probe)
    if probe.verl in contexts or any(key in {other.verl for other in group} for key in mine):
        return False
    if any(contexts.get(key, value) != value for key, value in mine.items()):
        return False
    same_mount = [other for other in group if other.mount is not None and other.mount == probe.mount]
    engines = {other.engine for other in same_mount if other.engine} | ({probe.engine} if probe.engine else set())
    megatron = any(engine[1] == "megatron" for engine in engines)
    return len(engines) <= 1 and not (megatron and same_mount and (probe.engine is None or any(o.engine is None for o in same_mount)))


def batches(found: list[Probe]) -> list[list[Probe]]:
    """Probes grouped into as few loads as ``_fits`` allows."""
    groups: list[list[Probe]] = []
    for probe in found:
        group = next((group for group in groups if _fits(probe, group)), None)
        if group is None:
            groups.append([probe])
        else:
            group.append(probe)
    return groups


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_every_mapped_verl_key_carries_its_value_to_the_config(entry):
    missed = []
    for group in batches(probes(entry)):
        args = [f"{probe.verl}={render_value(probe.value)}" for probe in group] + [a for p in group for a in p.context]
        translation = translate(VerlCommand(entry, args), "cuda")
        picks = sorted({f"{mount}={name}" for probe in group if probe.engine for mount, name in [probe.engine]})
        config = ENTRIES[entry].compose(["trainer.device=cuda", *picks, *translation.overrides])
        for probe in group:
            held = OmegaConf.select(config, probe.ours, default="<absent>")
            held = OmegaConf.to_container(held) if OmegaConf.is_config(held) else held
            landed = probe.expected in held if probe.ours in LANDS_IN.values() else held == probe.expected
            if not landed:
                missed.append(f"{probe.verl}={probe.value!r} -> {probe.ours}={held!r} (expected {probe.expected!r})")
    assert missed == []


def mapped_keys() -> set[str]:
    """Every rlflow key a verl key maps to, engine keys written once as ``<engine>.KEY``."""
    keys = set()
    for entry in ENTRIES:
        for verl, ours, _ in rows(entry):
            if verl is not None and ours is not None:
                match = MOUNT.match(ours)
                keys.add(f"<engine>.{match.group(2)}" if match else ours)
    return keys


def test_every_mapped_rlflow_key_has_a_reader():
    assert sorted(mapped_keys() - set(CONSUMED_IN)) == [], "name the file that reads each in CONSUMED_IN"
    assert sorted(set(CONSUMED_IN) - mapped_keys()) == [], "CONSUMED_IN lists keys no verl key maps to"
    unread = []
    for key, (path, *name) in CONSUMED_IN.items():
        token = name[0] if name else key.rstrip(".*").rsplit(".", 1)[-1]
        if not re.search(rf"[.\[\"'{{]{re.escape(token)}\b", (REPO / path).read_text()):
            unread.append(f"{key}: {path} does not read {token!r}")
    assert unread == []
