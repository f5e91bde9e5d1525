"""``model.trust_remote_code`` reaches every Hugging Face load: engines (policy and value models), both rollouts, tokenizers.

The loads are spied on at transformers' ``from_pretrained`` (the real loaders run), so a loader
that drops the flag on its way down fails here.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import vllm
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from rlflow.engines.common.forward.hf_module import load_forward_module
from rlflow.engines.common.forward.models import MODEL_KIND_REGISTRY
from rlflow.engines.config import config_from_mapping
from rlflow.engines.fsdp2 import FSDP2EngineConfig
from rlflow.models.loading import load_tokenizer
from rlflow.rollout.hf_rollout import HFRollout
from rlflow.trainer.entry_points import compose_ppo_config, compose_sft_config
from tests.rollout.rollout_testlib import rollout_config

ENGINE_MOUNTS = ("actor.engine", "critic.engine", "ref.engine", "reward.reward_model.engine")


@pytest.fixture
def loads(monkeypatch) -> dict[str, list]:
    """``{transformers class: [trust_remote_code of each from_pretrained call]}``."""
    seen: dict[str, list] = defaultdict(list)
    for cls in (AutoModelForTokenClassification, AutoModelForCausalLM, AutoTokenizer):
        original = cls.from_pretrained

        def spy(*args, _original=original, _name=cls.__name__, **kwargs):
            seen[_name].append(kwargs.get("trust_remote_code"))
            return _original(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    return seen


@pytest.mark.parametrize("trust", [True, False])
def test_engine_loads_pass_the_engine_configs_flag(loads, tiny_preset, trust):
    config = config_from_mapping(FSDP2EngineConfig, {"name": "fsdp2", "trust_remote_code": trust})
    load_forward_module(MODEL_KIND_REGISTRY.get("causal_lm"), tiny_preset, config, rank=0)
    load_forward_module(MODEL_KIND_REGISTRY.get("value"), tiny_preset, config, rank=0)
    assert loads == {"AutoModelForCausalLM": [trust], "AutoModelForTokenClassification": [trust]}


def test_tokenizer_loads_pass_the_flag(loads, tiny_preset):
    load_tokenizer(tiny_preset, trust_remote_code=True)
    load_tokenizer(tiny_preset)
    assert loads["AutoTokenizer"] == [True, False]


def test_hf_rollout_loads_model_and_tokenizer_with_the_flag(loads, tiny_preset):
    HFRollout(rollout_config("hf", trust_remote_code=True), tiny_preset, "cpu").shutdown()
    assert loads == {"AutoTokenizer": [True], "AutoModelForCausalLM": [True]}


def test_vllm_rollout_passes_the_flag_to_the_engine(loads, tiny_preset, monkeypatch):
    engines = []

    class RecordingLLM:
        def __init__(self, model, **kwargs):
            engines.append(kwargs)

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    from rlflow.rollout.vllm_rollout import VLLMRollout

    rollout = VLLMRollout(rollout_config("vllm", trust_remote_code=True), tiny_preset, "cpu")
    rollout._llm = None  # nothing to shut down
    assert [kwargs["trust_remote_code"] for kwargs in engines] == [True] and loads["AutoTokenizer"] == [True]


def test_the_config_hands_model_trust_remote_code_to_every_engine_and_the_rollout():
    config = compose_ppo_config(["model.trust_remote_code=true", "ref.engine.trust_remote_code=false"])
    assert {mount: OmegaConf.select(config, mount).trust_remote_code for mount in ENGINE_MOUNTS} == {
        "actor.engine": True, "critic.engine": True, "ref.engine": False, "reward.reward_model.engine": True}
    assert config.rollout.trust_remote_code is True
    default = compose_ppo_config([])
    assert not any(OmegaConf.select(default, mount).trust_remote_code for mount in ENGINE_MOUNTS)
    assert default.rollout.trust_remote_code is False
    assert compose_sft_config(["model.trust_remote_code=true"]).engine.trust_remote_code is True
