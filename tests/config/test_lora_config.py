"""LoRA's start-up errors (issue 19): each bad setting is one line naming its key, before Ray starts,
and the choice of linear layers that ``lora.target_modules`` / ``lora.parts`` make."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from one_line_errors import one_line_error
from transformers import AutoConfig, AutoModelForCausalLM

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.engines.common.forward.lora import target_module_names
from rlflow.engines.config import EngineConfigError, LoRAConfig
from rlflow.models.presets import build_preset
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("compose,mount", [(compose_sft_config, "engine"), (compose_ppo_config, "actor.engine")])
def test_lora_on_an_engine_without_it_is_refused(compose, mount):
    message = one_line_error(compose, [f"{mount}=torchtitan", f"{mount}.lora.rank=8"])
    assert f"config key '{mount}'" in message and "does not support lora" in message and "fsdp2" in message


@pytest.mark.parametrize("overrides,words", [
    (["rollout.lora_sync=adapter"], "needs a LoRA actor"),
    (["rollout=hf", "actor.engine.lora.rank=8", "rollout.lora_sync=adapter"], "merged weights only"),
    (["actor.engine.lora.rank=8", "rollout.lora_sync=adapters"], "unknown LoRA sync mode 'adapters' (config key rollout.lora_sync); registered: adapter, merged"),
    (["actor.engine.lora.rank=8", "actor.engine.lora.parts=[mlp,embedding]"], "unknown LoRA part 'embedding' (config key actor.engine.lora.parts); registered: attention, mlp, unembedding"),
    (["actor.engine.lora.rank=-1"], "config key 'actor.engine.lora.rank': must be >= 0 (0: no adapters), got -1"),
    (["actor.engine.lora.rank=8", "actor.engine.lora.alpha=0"], "config key 'actor.engine.lora.alpha': must be > 0, got 0.0"),
])
def test_bad_lora_settings_name_their_key(overrides, words):
    assert words in one_line_error(compose_ppo_config, overrides)


def test_a_missing_adapter_folder_is_refused_before_ray(tmp_path):
    message = one_line_error(compose_sft_config, ["engine.lora.rank=8", f"engine.lora.adapter_path={tmp_path / 'nope'}"])
    assert "lora.adapter_path" in message and "not a peft adapter folder" in message


def test_cli_exits_2_with_one_line_before_ray_starts(tmp_path):
    ray_dir = tmp_path / "ray"
    result = subprocess.run(
        [sys.executable, "-m", "rlflow.trainer.main_ppo", "actor.engine=torchtitan", "actor.engine.lora.rank=8",
         f"trainer.ray_temp_dir={ray_dir}", f"trainer.default_local_dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "lora" in lines[0], result.stderr[-2000:]
    assert not ray_dir.exists() and not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, AutoModelForCausalLM]:
    root = tmp_path_factory.mktemp("lora_presets")
    folders = {name: build_preset(root / name, tokenizer_corpus(), preset=name, seed=0) for name in ("tiny", "tiny-qwen3")}
    return {name: AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)) for name, folder in folders.items()}


def _leaves(names: list[str]) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name in names}


def test_all_linear_covers_the_parts_asked_for(models):
    model = models["tiny"]
    layers = model.config.num_hidden_layers
    attention_mlp = target_module_names(model, LoRAConfig(rank=4))
    assert _leaves(attention_mlp) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(attention_mlp) == 7 * layers
    assert _leaves(target_module_names(model, LoRAConfig(rank=4, parts=["mlp"]))) == {"gate_proj", "up_proj", "down_proj"}
    assert target_module_names(model, LoRAConfig(rank=4, parts=["unembedding"])) == ["lm_head"]


def test_named_targets_match_by_last_component_and_unknown_names_are_refused(models):
    model = models["tiny"]
    assert _leaves(target_module_names(model, LoRAConfig(rank=4, target_modules=["q_proj", "v_proj"]))) == {"q_proj", "v_proj"}
    with pytest.raises(EngineConfigError, match="qkv_proj.*match no linear layer"):
        target_module_names(model, LoRAConfig(rank=4, target_modules=["qkv_proj"]))


def test_an_adapter_on_a_tied_lm_head_is_refused(models):
    assert models["tiny-qwen3"].config.tie_word_embeddings
    with pytest.raises(EngineConfigError, match="tied input/output embeddings"):
        target_module_names(models["tiny-qwen3"], LoRAConfig(rank=4, parts=["attention", "unembedding"]))
