"""The verl values that change form on their way to rlflow's key, by the end of verl's key.

Most verl keys carry their value over as it is (the key table names the rlflow key). The rest
are here, each a function ``(args, verl key, rlflow key, value) -> Conversion`` registered under
the end of the verl key it applies to (``fsdp_size`` under every role); ``conversion_for`` finds
it. A value that has no rlflow form raises ``Unmappable`` with the reason and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from rlflow.config.loading.verl_args import ACTOR, VerlArgs
from rlflow.rollout.kv_cache import CPU_FRACTION_REFUSAL

ENGINE_NAMES = {"fsdp": "fsdp", "fsdp2": "fsdp2", "megatron": "megatron"}  # verl strategy -> rlflow engine


class Unmappable(Exception):
    """A verl value rlflow has no form for; the message is the reason and what to do instead."""


@dataclass
class Conversion:
    """The rlflow ``(key, value)`` pairs a verl override becomes, and a note on how (empty: carried over as it is)."""

    pairs: list[tuple[str, Any]]
    note: str = ""
    folded: list[str] = field(default_factory=list)  # verl keys whose values this one took in


Converter = Callable[[VerlArgs, str, str, Any], Conversion]
CONVERSIONS: dict[str, Converter] = {}


def converts(*suffixes: str) -> Callable[[Converter], Converter]:
    """Register a converter for verl keys ending in any of ``suffixes`` (whole dotted parts)."""

    def register(function: Converter) -> Converter:
        for suffix in suffixes:
            CONVERSIONS[suffix] = function
        return function

    return register


def conversion_for(verl_key: str) -> Optional[Converter]:
    """The converter registered for the longest dotted ending of ``verl_key``, or None."""
    parts = verl_key.split(".")
    return next((CONVERSIONS[".".join(parts[i:])] for i in range(len(parts)) if ".".join(parts[i:]) in CONVERSIONS), None)


def _optim_prefix(verl_key: str) -> str:
    """``actor_rollout_ref.actor.optim.`` for ``actor_rollout_ref.actor.optim.min_lr`` (SFT: ``optim.``)."""
    return verl_key[: verl_key.rindex("optim.") + len("optim.")]


@converts("strategy")
def _engine_pick(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if value not in ENGINE_NAMES:
        raise Unmappable(f"strategy {value!r} has no rlflow engine; pick one of {', '.join(ENGINE_NAMES)} "
                         f"({ours.removesuffix('.name')}=NAME)")
    mount = ours.removesuffix(".name")
    return Conversion([(mount, ENGINE_NAMES[value])], f"the engine is picked by name: {mount}={ENGINE_NAMES[value]}")


VERL_RESUME_MODES = {"resume_path": "path"}  # verl's resume_mode values rlflow spells otherwise (auto, disable: same)


@converts("trainer.resume_mode")
def _resume_mode(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if value in VERL_RESUME_MODES:
        return Conversion([(ours, VERL_RESUME_MODES[value])], f"verl's {value} is rlflow's {VERL_RESUME_MODES[value]}")
    return Conversion([(ours, value)])


@converts("hybrid_engine")
def _placement(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    return Conversion([(ours, "colocated" if value else "split")], "true: colocated roles; false: a pool per role")


@converts("custom_reward_function.path")
def _reward_function(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    name = args.value("custom_reward_function.name")
    return Conversion([(ours, f"{value}:{name}")], "path and function name in one key", ["custom_reward_function.name"])


@converts("custom_reward_function.name")
def _reward_function_name(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if not args.has("custom_reward_function.path"):
        raise Unmappable("a function name without custom_reward_function.path; set reward.custom_function=path.py:name")
    return Conversion([], "joined with custom_reward_function.path")


@converts("prompt_dict_keys", "response_dict_keys")
def _nested_column(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    column = args.value(verl_key.replace("_dict_keys", "_key"))
    path = ".".join([str(column), *([value] if isinstance(value, str) else list(value))])
    return Conversion([(ours, path)], "the column and its nested keys as one dotted path", [verl_key.replace("_dict_keys", "_key")])


@converts("data.prompt_key", "data.response_key")
def _column(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if args.has(verl_key.replace("_key", "_dict_keys")):
        return Conversion([], f"joined with {verl_key.replace('_key', '_dict_keys')}")
    return Conversion([(ours, value)])


@converts("optim.lr_warmup_steps_ratio")
def _warmup_ratio(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    prefix = _optim_prefix(verl_key)
    steps = args.value(f"{prefix}lr_warmup_steps", -1)
    if steps is not None and steps >= 0:
        raise Unmappable(f"verl uses {prefix}lr_warmup_steps={steps} instead of the ratio")
    if not value:
        return Conversion([(ours, 0)])
    run = args.run_steps()
    if run is None:
        raise Unmappable(f"the run's length is not known here (no trainer.total_training_steps and the train files are not "
                         f"readable on this machine); set {ours} in optimizer steps")
    role = "actor" if verl_key.startswith(ACTOR) else "critic"
    updates = args.updates_per_step(role)
    warmup = int(value * run[0]) * updates
    return Conversion([(ours, warmup)], f"int({value} x {run[0]} steps ({run[1]})) x {updates} optimizer steps per step")


@converts("optim.lr_warmup_steps")
def _warmup_steps(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if value is None or value < 0:
        return Conversion([], "verl's -1: the ratio decides")
    return Conversion([(ours, value)])


@converts("optim.total_training_steps")
def _schedule_length(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if value is None or value < 0:
        return Conversion([], "verl's -1: the run's length (rlflow's 0, its default)")
    return Conversion([(ours, value)])


@converts("optim.min_lr")
def _min_lr(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    lr = args.value(f"{_optim_prefix(verl_key)}lr")
    if not lr:
        raise Unmappable(f"min_lr needs the peak lr to become {ours}; set it as min_lr / lr")
    return Conversion([(ours, value / lr)], f"min_lr / lr = {value} / {lr}")


@converts("fsdp_size")
def _replicas(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if value is None or value < 0:
        return Conversion([], "verl's -1: shard over every rank (rlflow's 1 replica, its default)")
    world = args.world_size
    if world % value:
        raise Unmappable(f"fsdp_size {value} does not divide the {world} ranks")
    return Conversion([(ours, world // value)], f"{world} ranks / shard groups of {value} = {world // value} replicas")


@converts("ulysses_sequence_parallel_size")
def _ulysses(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if value is None or value == 1:
        return Conversion([(ours, 1)])
    kernel = f"{ours.rsplit('.', 1)[0]}.attn_implementation"
    return Conversion([(ours, value), (kernel, "sdpa_varlen")],
                      "with attn_implementation=sdpa_varlen: verl runs Ulysses on flash attention's variable-length "
                      "kernel, rlflow on the portable one (flash_attention_2 where flash-attn is installed)")


@converts("override_transformer_config.recompute_granularity")
def _recompute(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if value is None:
        return Conversion([])
    if value != "full":
        raise Unmappable(f"recompute_granularity={value} has no rlflow form; {ours}=true recomputes whole decoder layers")
    return Conversion([(ours, True)], "full recompute: every decoder layer")


@converts("rollout.gpu_memory_utilization")
def _kv_cache_fraction(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if args.device != "cuda":
        raise Unmappable(CPU_FRACTION_REFUSAL.split(": ", 1)[1] + " (default 1.0)")
    return Conversion([(ours, value)], "the KV cache as this fraction of the GPU memory free once the actor is loaded "
                                       "(verl: vLLM's share of the whole device, weights included)")


@converts("rollout.tensor_model_parallel_size")
def _rollout_tp(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    if value != 1:
        raise Unmappable(f"rlflow splits a rollout engine over tensor-parallel devices on a split rollout pool only "
                         f"(trainer.placement=split, rollout.tensor_parallel_size); verl's colocated layout keeps a whole "
                         f"replica per GPU here (more replicas: rollout.num_replicas); {value} is left out")
    return Conversion([(ours, value)])


@converts("model.path", "model.partial_pretrain")
def _model_folder(args: VerlArgs, verl_key: str, ours: str, value: Any) -> Conversion:
    local = "" if Path(str(value)).expanduser().is_dir() else (
        "; not a folder here: verl downloads hub names, rlflow loads a local folder (download it, e.g. with "
        "huggingface-cli download NAME --local-dir DIR, and give DIR)")
    if ours != "model.path":  # critic.model.path, reward_model.model.path: the folder alone
        return Conversion([(ours, value)], local.removeprefix("; "))
    return Conversion([(ours, value), ("model.preset", None)], "an HF folder: rlflow's preset off" + local)
