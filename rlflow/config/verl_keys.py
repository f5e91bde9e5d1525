"""verl's config keys in rlflow: the translation table (``verl_key_table``), its lookup, and its markdown.

``verl_key_message(entry, key)`` is the one-line error for a command-line key that is verl's name
(``actor_rollout_ref.actor.optim.lr``): it names rlflow's key, or says rlflow has none and why.
docs/from_verl_keys.md shows the same table; ``python -m rlflow.config.verl_keys`` prints it, and a
test checks the two agree.
"""

from __future__ import annotations

import functools
from typing import Optional

from rlflow.config.verl_engine_key_table import (
    FSDP_ROWS,
    MEGATRON_ROWS,
    OPTIM_ROWS,
    RLFLOW_ONLY_ENGINE_KEYS,
    EngineMount,
    Row,
    engine_rows,
)
from rlflow.config.verl_key_table import PPO_ENGINE_MOUNTS, PPO_SECTIONS, RUN_ROWS, SFT_ENGINE_MOUNTS, SFT_SECTIONS

GUIDE = "docs/from_verl_keys.md"
# Each entry point's config name -> its table: (section title, rows) and its engine mounts.
TABLES: dict[str, tuple[list[tuple[str, list[Row]]], list[EngineMount]]] = {
    "ppo_trainer": (PPO_SECTIONS, PPO_ENGINE_MOUNTS),
    "sft_trainer": (SFT_SECTIONS, SFT_ENGINE_MOUNTS),
}
# Top-level verl sections rlflow does not have, with where their keys went.
VERL_ONLY_SECTIONS: dict[str, dict[str, str]] = {
    "ppo_trainer": {
        "actor_rollout_ref": "rlflow splits it into model.*, actor.*, ref.* and rollout.*, each role's engine under <role>.engine",
        "custom_reward_function": "rlflow's is reward.custom_function=path.py:fn",
        "reward_model": "rlflow's is reward.reward_model.*",
        "reward_manager": "rlflow has one reward manager (reward.*)",
    },
    "sft_trainer": {
        "optim": "rlflow's optimizer and schedule are engine.optimizer.* and engine.lr_scheduler.*",
    },
}


@functools.lru_cache(maxsize=None)
def _rows(entry: str) -> tuple[Row, ...]:
    sections, mounts = TABLES[entry]
    every = [row for _, section in sections for row in section] + RUN_ROWS
    every += [row for mount in mounts for row in engine_rows(mount)]
    mapped = {ours for verl, ours, _ in every if verl is not None}
    return tuple(dict.fromkeys(row for row in every if row[0] is not None or row[1] not in mapped))


def rows(entry: str) -> list[Row]:
    """Every row of ``entry``'s table (``ppo_trainer`` or ``sft_trainer``), the engine rows of each mount
    included; an rlflow-only row is left out when another row maps a verl key to the same rlflow key."""
    return list(_rows(entry))


def covers(verl: str, key: str) -> bool:
    """Whether a row's verl key ``verl`` names ``key``: the same key, or a ``prefix.*`` row over it."""
    return verl == key or (verl.endswith(".*") and key.startswith(verl[:-1]))


def find_row(entry: str, key: str) -> Optional[Row]:
    """The row of ``entry``'s table for the verl key ``key``: its own row, else the longest ``prefix.*`` row over it."""
    candidates = [row for row in _rows(entry) if row[0] is not None and covers(row[0], key)]
    return max(candidates, key=lambda row: (row[0] == key, len(row[0])), default=None)


def rlflow_key(row: Row, key: str) -> Optional[str]:
    """The rlflow key ``row`` maps the verl key ``key`` to (a ``prefix.*`` row keeps what follows the prefix)."""
    verl, ours, _ = row
    if ours is None or not ours.endswith(".*"):
        return ours
    return ours[:-1] + key[len(verl) - 1:]


def verl_key_message(entry: str, key: str) -> Optional[str]:
    """The error for ``key`` when it is verl's name and not rlflow's; None when it is not a verl-only name.

    The caller decides whether ``key`` is also an rlflow key (then there is nothing to say).
    """
    row = find_row(entry, key)
    ours = None if row is None else rlflow_key(row, key)
    if row is not None and ours != key:
        if ours is None:
            why = f": {row[2]}" if row[2] else ""
            return f"unknown key '{key}': this is verl's name; rlflow has no equivalent{why} ({GUIDE})"
        return f"unknown key '{key}': this is verl's name; rlflow's is '{ours}' ({GUIDE})"
    section = key.split(".")[0]
    where = VERL_ONLY_SECTIONS[entry].get(section)
    if where is not None:
        return f"unknown key '{key}': '{section}' is verl's layout; {where} ({GUIDE})"
    return None


def _cell(value: Optional[str]) -> str:
    return f"`{value}`" if value else "-"


def _escape(note: str) -> str:
    return note.replace("|", "\\|")


def _table(table_rows: list[Row]) -> list[str]:
    return (["| verl key | rlflow key | notes |", "|---|---|---|"]
            + [f"| {_cell(verl)} | {_cell(ours)} | {_escape(note)} |" for verl, ours, note in table_rows] + [""])


def _prefix_cell(prefix: Optional[str]) -> str:
    return _cell(prefix.rstrip(".") if prefix else None)


def _mounts_markdown(mounts: list[EngineMount]) -> list[str]:
    lines = ["| rlflow `<engine>` | verl `<optim>` | verl `<fsdp_config>` | verl `<megatron>` |", "|---|---|---|---|"]
    return lines + [f"| `{mount.node}` | {_prefix_cell(mount.optim) if mount.optim else '- (no optimizer: the optimizer keys are unused)'} "
                    f"| {_prefix_cell(mount.fsdp)} | {_prefix_cell(mount.megatron)} |" for mount in mounts] + [""]


def _engine_markdown() -> list[str]:
    """The engine keys once, with ``<optim>``, ``<fsdp_config>``, ``<megatron>`` and ``<engine>`` standing for each mount's
    prefixes."""
    generic = []
    for prefix, table in (("optim", OPTIM_ROWS), ("fsdp_config", FSDP_ROWS), ("megatron", MEGATRON_ROWS)):
        generic += [(f"<{prefix}>.{verl}" if verl else None, f"<engine>.{ours}" if ours else None, note) for verl, ours, note in table]
    generic += [(None, f"<engine>.{ours}", note) for ours, note in RLFLOW_ONLY_ENGINE_KEYS]
    return _table(generic)


def render_markdown() -> str:
    """Both entry points' tables as markdown, the way docs/from_verl_keys.md holds them."""
    lines = []
    for entry, title in (("ppo_trainer", "main_ppo (rlflow/configs/ppo_trainer.yaml)"), ("sft_trainer", "main_sft (rlflow/configs/sft_trainer.yaml)")):
        sections, _ = TABLES[entry]
        kept = set(rows(entry))
        lines += [f"### {title}", ""]
        for section, section_rows in sections:
            lines += [f"#### {section}", ""] + _table([row for row in dict.fromkeys(section_rows) if row in kept])
    lines += ["### trainer keys of both entry points", ""] + _table(RUN_ROWS)
    lines += ["### engine keys", "", "The same keys under every engine mount; `<engine>`, `<optim>`, `<fsdp_config>` and `<megatron>`",
              "stand for these prefixes (a verl key ending in `.*` covers every key below it):", ""]
    lines += _mounts_markdown(PPO_ENGINE_MOUNTS + SFT_ENGINE_MOUNTS) + _engine_markdown()
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_markdown(), end="")
