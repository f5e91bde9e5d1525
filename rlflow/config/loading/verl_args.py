"""A verl command's settings as verl itself would read them: what the script set, else verl's default.

verl's YAML fills many keys from others (the critic's mini-batch and dynamic batching from the
actor's, the reference's log-prob batching from the actor's, the reward model's from the
critic's); ``VERL_DEFAULTS`` writes those rules and the plain defaults the translation needs, as
read from verl's generated ``ppo_trainer.yaml`` and its ``sft_trainer.yaml``. ``VerlArgs.value``
answers from the script first, then from these rules, so an inherited value follows the key it
comes from as the script set it. ``run_steps`` is the run's length in training steps when it can
be known here (``trainer.total_training_steps``, or epochs over the rows of train files this
machine can read).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from rlflow.data.files import resolve_files
from rlflow.errors import UserError

ACTOR, REF, ROLLOUT = "actor_rollout_ref.actor.", "actor_rollout_ref.ref.", "actor_rollout_ref.rollout."
Default = Callable[["VerlArgs"], Any]


def const(value: Any) -> Default:
    return lambda args: value


def same_as(key: str) -> Default:
    """verl's ``${oc.select:key,...}``: the value of another key, as the script set it or as it defaults."""
    return lambda args: args.value(key)


VERL_DEFAULTS: dict[str, dict[str, Default]] = {
    "ppo_trainer": {
        "algorithm.adv_estimator": const("gae"),
        "algorithm.use_kl_in_reward": const(False),
        "data.max_prompt_length": const(512),
        "data.max_response_length": const(512),
        "data.train_batch_size": const(1024),
        f"{ACTOR}ppo_mini_batch_size": const(256),
        f"{ACTOR}ppo_epochs": const(1),
        f"{ACTOR}shuffle": const(False),
        f"{ACTOR}loss_agg_mode": const("token-mean"),
        f"{ACTOR}use_kl_loss": const(False),
        f"{ACTOR}use_dynamic_bsz": const(False),
        f"{ACTOR}ppo_max_token_len_per_gpu": const(16384),
        f"{ACTOR}optim.lr": const(1e-6),
        f"{ACTOR}optim.lr_warmup_steps": const(-1),
        f"{ACTOR}strategy": const("fsdp"),
        f"{REF}strategy": same_as(f"{ACTOR}strategy"),
        f"{REF}log_prob_use_dynamic_bsz": same_as(f"{ACTOR}use_dynamic_bsz"),
        f"{REF}log_prob_max_token_len_per_gpu": same_as(f"{ACTOR}ppo_max_token_len_per_gpu"),
        f"{ROLLOUT}n": const(1),
        "critic.ppo_mini_batch_size": same_as(f"{ACTOR}ppo_mini_batch_size"),
        "critic.ppo_epochs": same_as(f"{ACTOR}ppo_epochs"),
        "critic.shuffle": same_as(f"{ACTOR}shuffle"),
        "critic.loss_agg_mode": same_as(f"{ACTOR}loss_agg_mode"),
        "critic.use_dynamic_bsz": same_as(f"{ACTOR}use_dynamic_bsz"),
        "critic.ppo_max_token_len_per_gpu": const(32768),
        "critic.forward_max_token_len_per_gpu": same_as("critic.ppo_max_token_len_per_gpu"),
        "critic.optim.lr": const(1e-5),
        "critic.optim.lr_warmup_steps": const(-1),
        "reward_model.enable": const(False),
        "reward_model.use_dynamic_bsz": same_as("critic.use_dynamic_bsz"),
        "reward_model.forward_max_token_len_per_gpu": same_as("critic.forward_max_token_len_per_gpu"),
        "custom_reward_function.name": const("compute_score"),
        "data.prompt_key": const("prompt"),
        "trainer.total_epochs": const(30),
        "trainer.total_training_steps": const(None),
        "trainer.nnodes": const(1),
        "trainer.n_gpus_per_node": const(8),
        "trainer.device": const("cuda"),
    },
    "sft_trainer": {
        "data.train_batch_size": const(256),
        "data.max_length": const(1024),
        "data.prompt_key": const("question"),
        "data.response_key": const("answer"),
        "data.multiturn.enable": const(False),
        "optim.lr": const(1e-5),
        "optim.betas": const([0.9, 0.95]),
        "optim.weight_decay": const(0.01),
        "optim.lr_warmup_steps_ratio": const(0.1),
        "optim.lr_warmup_steps": const(-1),
        "optim.min_lr_ratio": const(0.0),
        "trainer.total_epochs": const(4),
        "trainer.total_training_steps": const(None),
        "trainer.nnodes": const(1),
        "trainer.n_gpus_per_node": const(8),
        "trainer.device": const("cuda"),
    },
}


def count_rows(files: Any) -> Optional[int]:
    """The rows of the data files ``files`` (one or a list; parquet or JSON lines), or None if any cannot be read."""
    try:
        paths = resolve_files(list(files) if isinstance(files, (list, tuple)) else [files])
        return sum(pq.read_metadata(path).num_rows if Path(path).suffix == ".parquet"
                   else sum(1 for line in Path(path).read_text().splitlines() if line.strip()) for path in paths)
    except (OSError, ValueError, UserError, pa.ArrowException):  # a path of another machine, a file not of these forms
        return None


@dataclass
class VerlArgs:
    """What a verl command set (``given``: verl key -> value), for ``entry``, read with verl's defaults."""

    entry: str
    given: dict[str, Any]
    device: str = "cpu"  # the device the translated run will use: cpu | cuda
    config_name: Optional[str] = None  # verl's --config-name, if the command gave one

    def has(self, key: str) -> bool:
        return key in self.given

    def value(self, key: str, fallback: Any = None) -> Any:
        """The script's value of ``key``, else verl's default (``VERL_DEFAULTS``), else ``fallback``."""
        if key in self.given:
            return self.given[key]
        default = VERL_DEFAULTS[self.entry].get(key)
        return fallback if default is None else default(self)

    @property
    def uses_critic(self) -> bool:
        return self.entry == "ppo_trainer" and self.value("algorithm.adv_estimator") == "gae"

    @property
    def uses_reference(self) -> bool:
        return self.entry == "ppo_trainer" and bool(self.value(f"{ACTOR}use_kl_loss") or self.value("algorithm.use_kl_in_reward"))

    @property
    def world_size(self) -> int:
        return int(self.value("trainer.nnodes")) * int(self.value("trainer.n_gpus_per_node"))

    def run_steps(self) -> Optional[tuple[int, str]]:
        """(training steps of the run, how that is known), or None when this machine cannot know it."""
        total = self.value("trainer.total_training_steps")
        if total is not None:
            return int(total), f"trainer.total_training_steps={total}"
        rows = count_rows(self.value("data.train_files"))
        if rows is None:
            return None
        batch, epochs = int(self.value("data.train_batch_size")), int(self.value("trainer.total_epochs"))
        return rows // batch * epochs, f"{rows} train rows // {batch} per batch x {epochs} epochs"

    def updates_per_step(self, role: str) -> int:
        """Optimizer steps per training step: verl steps its LR schedule once per step, rlflow once per update."""
        if self.entry == "sft_trainer":
            return 1
        prefix = ACTOR if role == "actor" else "critic."
        mini = int(self.value(f"{prefix}ppo_mini_batch_size"))
        return int(self.value("data.train_batch_size")) // mini * int(self.value(f"{prefix}ppo_epochs"))
