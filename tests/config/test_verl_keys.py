"""The verl -> rlflow key table: it covers every key in configs/, names only real rlflow keys, agrees
with docs/from_verl_keys.md, and a verl key on the command line is one line naming rlflow's, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlflow.config import ConfigError
from rlflow.config.verl_keys import find_row, render_markdown, rows, verl_key_message
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config
from rlflow.config.loading.verl_overrides import is_rlflow_key, override_key

REPO = Path(__file__).resolve().parents[2]
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "from_verl_keys.md"
BEGIN, END = "<!-- verl-keys:begin (python -m rlflow.config.verl_keys) -->", "<!-- verl-keys:end -->"
ENTRIES = ("ppo_trainer", "sft_trainer")


def leaves(node: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in node.items():
        if isinstance(value, dict) and value:
            keys |= leaves(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


def config_keys(entry: str) -> set[str]:
    """Every leaf key of the entry's composed config, with each built-in engine picked once."""
    if entry == "sft_trainer":
        configs = [compose_sft_config([]), compose_sft_config(["engine=fsdp"])]
    else:
        configs = [compose_ppo_config([]), compose_ppo_config([f"{m}=fsdp" for m in
                                                               ("actor.engine", "critic.engine", "ref.engine", "reward.reward_model.engine")])]
    return set().union(*(leaves(OmegaConf.to_container(config)) for config in configs))


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_key_in_configs_has_a_row(entry):
    covered = {ours for _, ours, _ in rows(entry) if ours is not None}
    missing = sorted(config_keys(entry) - covered)
    assert not missing, f"add rows to rlflow/config/verl_key_table.py for: {missing}"


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_rlflow_key_named_exists_and_every_renamed_verl_key_does_not(entry):
    named = {ours for _, ours, _ in rows(entry) if ours is not None}
    assert [key for key in sorted(named) if not is_rlflow_key(entry, key)] == []
    renamed = {verl for verl, ours, _ in rows(entry) if verl is not None and verl != ours}
    assert [key for key in sorted(renamed) if is_rlflow_key(entry, key)] == [], "rlflow now has these verl names: fix their rows"


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_verl_key_maps_to_one_rlflow_key(entry):
    targets: dict[str, set] = {}
    for verl, ours, _ in rows(entry):
        if verl is not None:
            targets.setdefault(verl, set()).add(ours)
    assert {verl: ours for verl, ours in targets.items() if len(ours) > 1} == {}


def test_the_guide_holds_the_table():
    text = GUIDE.read_text()
    assert BEGIN in text and END in text
    block = text.split(BEGIN)[1].split(END)[0]
    assert block.strip() == render_markdown().strip(), "regenerate docs/from_verl_keys.md: python -m rlflow.config.verl_keys"


def test_override_keys():
    assert override_key("+a.b=1") == "a.b" and override_key("++a.b=1") == "a.b" and override_key("~a.b") == "a.b"
    assert override_key("--cfg") is None and override_key("engine@actor.engine=fsdp") is None


def test_in_process_compose_refuses_a_verl_key_and_keeps_shared_names():
    with pytest.raises(ConfigError, match=r"^unknown key 'critic\.optim\.lr': this is verl's name; rlflow's is "
                                          r"'critic\.engine\.optimizer\.lr' \(docs/from_verl_keys\.md\)$"):
        compose_ppo_config(["critic.optim.lr=1e-5"])
    with pytest.raises(ConfigError, match=r"^unknown key 'optim\.lr': this is verl's name; rlflow's is 'engine\.optimizer\.lr'"):
        compose_sft_config(["+optim.lr=1e-5"])
    with pytest.raises(ConfigError, match=r"^unknown key 'data\.multiturn\.enable': this is verl's name; rlflow has no equivalent: "):
        compose_sft_config(["data.multiturn.enable=true"])
    assert compose_ppo_config(["data.train_batch_size=8", "critic.ppo_epochs=2"]).data.train_batch_size == 8


def test_every_verl_key_is_listed_in_one_error():
    with pytest.raises(ConfigError) as raised:
        compose_ppo_config(["actor_rollout_ref.actor.optim.lr=1e-6", "data.train_batch_size=8",
                            "actor_rollout_ref.rollout.n=5", "+trainer.balance_batch=true", "--config-name=ppo_megatron_trainer"])
    lines = str(raised.value).splitlines()
    assert [line.split("'")[1] for line in lines[:4]] == [
        "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.n", "trainer.balance_batch", "--config-name"]
    assert "actor.engine=megatron ref.engine=megatron" in lines[3]
    assert lines[4].startswith("4 verl keys or flags above; rlflow-from-verl translates")


def test_cli_names_the_rlflow_keys_one_line_each_before_ray(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rlflow.trainer.main_ppo", "actor_rollout_ref.actor.optim.lr=1e-6",
                             "critic.optim.lr=1e-5"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    expected = [
        "error: unknown key 'actor_rollout_ref.actor.optim.lr': this is verl's name; rlflow's is 'actor.engine.optimizer.lr' "
        "(docs/from_verl_keys.md)",
        "error: unknown key 'critic.optim.lr': this is verl's name; rlflow's is 'critic.engine.optimizer.lr' (docs/from_verl_keys.md)",
        "error: 2 verl keys or flags above; rlflow-from-verl translates a whole verl command (docs/from_verl_keys.md)",
    ]
    assert (result.returncode, result.stderr.strip().splitlines(), result.stdout) == (2, expected, "")


def test_checking_common_engine_keys_imports_no_other_engine():
    """The key check stops at the first engine whose config has the key: an fsdp2 run's keys never import
    the Megatron or torchtitan engines (a machine whose torchtitan does not import still runs fsdp2)."""
    code = (
        "import sys\n"
        "from rlflow.config.loading.verl_overrides import check_verl_overrides\n"
        "check_verl_overrides('ppo_trainer', ['actor.engine=fsdp2', 'actor.engine.micro_batch_size=8',\n"
        "                                     'actor.engine.compile=true', 'actor.engine.param_dtype=float32'])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('rlflow.engines.megatron', 'rlflow.engines.torchtitan'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


EXAMPLE_KEYS = Path(__file__).resolve().parent / "verl_example_keys.txt"


def example_keys(entry: str) -> list[str]:
    lines = [line.split() for line in EXAMPLE_KEYS.read_text().splitlines() if line and not line.startswith("#")]
    return [key for name, key in lines if name == entry]


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_key_of_verls_example_scripts_has_its_own_row(entry):
    """Not the generic "verl's layout" line: each key is mapped, or refused with its own reason."""
    keys = example_keys(entry)
    assert len(keys) > 50
    missing = [key for key in keys if find_row(entry, key) is None and not is_rlflow_key(entry, key)]
    assert missing == [], f"add rows to rlflow/config/verl_key_table.py for: {missing}"


def test_megatron_parallel_sizes_map_to_the_megatron_engine():
    for role, mount in (("actor_rollout_ref.actor", "actor.engine"), ("actor_rollout_ref.ref", "ref.engine"), ("critic", "critic.engine")):
        for size in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
            assert verl_key_message("ppo_trainer", f"{role}.megatron.{size}").endswith(f"rlflow's is '{mount}.{size}' (docs/from_verl_keys.md)")
    message = verl_key_message("ppo_trainer", "actor_rollout_ref.actor.megatron.override_transformer_config.moe_grouped_gemm")
    assert "rlflow has no equivalent: the TransformerConfig comes from the HF config.json" in message
