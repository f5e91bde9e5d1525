"""In-process unit tests of the engine registry, the engine configs (dataclasses and YAML) and the capability
check of ``BaseEngine``; the shared machinery's rooms have their own modules (``test_batching.py``, ...)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddp_engine  # noqa: F401  (registers test_ddp)
from rlflow.engines import BaseEngine, EngineConfigError, ENGINE_REGISTRY, build_engine, get_engine_cls
from rlflow.engines.config import EngineConfig, HFModuleEngineConfig, config_from_mapping
from rlflow.engines.fsdp import FSDPEngine, FSDPEngineConfig
from rlflow.engines.fsdp2 import FSDP2Engine, FSDP2EngineConfig
from rlflow.config.loading.auto_settings import AUTO, ENGINE_RULES
from rlflow.config.loading.hydra_entry import CONFIG_DIR


# ------------------------------------------------------------------------- registry and config
def test_unknown_engine_lists_registered() -> None:
    with pytest.raises(EngineConfigError, match=r"unknown engine 'nope' \(config key engine.name\); registered: fsdp, fsdp2"):
        get_engine_cls("nope")
    with pytest.raises(EngineConfigError, match="needs a 'name'"):
        build_engine({}, "unused")


def test_build_engine_validates_against_the_engine_dataclass(model_path: Path) -> None:
    engine = build_engine({"name": "fsdp2", "hybrid_replicate_size": 2, "optimizer": {"lr": 0.5}}, model_path)
    assert isinstance(engine, FSDP2Engine) and isinstance(engine.config, FSDP2EngineConfig)
    assert engine.config.optimizer.lr == 0.5 and engine.config.hybrid_replicate_size == 2
    assert isinstance(build_engine({"name": "fsdp"}, model_path), FSDPEngine)
    with pytest.raises(EngineConfigError, match="hybrid_replicate_size"):
        build_engine({"name": "fsdp", "hybrid_replicate_size": 2}, model_path)  # an fsdp2-only key
    with pytest.raises(EngineConfigError, match="optimizer.lrr"):
        build_engine({"name": "fsdp2", "optimizer": {"lrr": 1.0}}, model_path)
    with pytest.raises(EngineConfigError, match="'micro_batch_size': must be >= 1, got 0"):
        config_from_mapping(FSDPEngineConfig, {"micro_batch_size": 0})
    with pytest.raises(ValueError, match="unknown model kind"):
        build_engine({"name": "fsdp2"}, model_path, model_kind="diffusion")


def test_registering_a_new_engine() -> None:
    from dataclasses import dataclass

    @dataclass
    class ToyConfig(EngineConfig):
        name: str = "toy_test_engine"
        toy_knob: int = 3

    with ENGINE_REGISTRY.temporary():

        @ENGINE_REGISTRY.register("toy_test_engine")
        class ToyEngine(FSDP2Engine):
            config_class = ToyConfig

        engine = build_engine({"name": "toy_test_engine", "toy_knob": 5}, "unused")
        assert isinstance(engine, ToyEngine) and engine.config.toy_knob == 5
        assert "toy_test_engine" in ENGINE_REGISTRY.names()
        with pytest.raises(TypeError):
            ENGINE_REGISTRY.register("not_an_engine")(dict)
    assert "toy_test_engine" not in ENGINE_REGISTRY
    assert issubclass(ToyEngine, BaseEngine)


@pytest.mark.parametrize("name", ["fsdp", "fsdp2", "megatron", "torchtitan"])
def test_engine_yaml_is_valid_and_documented(name: str) -> None:
    from hydra import compose, initialize_config_dir

    configs = Path(CONFIG_DIR)
    with initialize_config_dir(str(configs), version_base=None):
        node = without_auto_keys(compose(config_name=f"engine/{name}").engine)
    config = config_from_mapping(get_engine_cls(name).config_class, node)
    assert config.name == name
    defaults = type(config)()
    assert config == type(defaults)(**{**defaults.__dict__, "name": name})  # the YAML restates the defaults
    common = configs / "engine" / "common"
    for path in (configs / "engine" / f"{name}.yaml", common / "hf_module.yaml", common / "base.yaml"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped and not stripped.startswith(("#", "- ")) and stripped != "defaults:":
                assert "#" in stripped, f"{path.name}: '{stripped}' has no comment"


def without_auto_keys(node) -> dict:
    """The YAML node without its ``auto`` speed keys, which config loading settles (only those of
    ``auto_settings.ENGINE_RULES`` may be ``auto``); the engine classes keep plain defaults for them (sdpa, off).
    ``device: auto`` is a value the engines resolve themselves and stays."""
    auto = {key for key, value in node.items() if value == AUTO and key != "device"}
    assert auto <= set(ENGINE_RULES), auto
    return {key: value for key, value in node.items() if key not in auto}


@pytest.mark.parametrize("option,config_class", [("base", EngineConfig), ("hf_module", HFModuleEngineConfig)])
def test_common_engine_yaml_layers_match_their_dataclasses(option: str, config_class: type) -> None:
    """base.yaml alone is a complete EngineConfig (what megatron.yaml composes); hf_module.yaml adds the HF keys."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(CONFIG_DIR, version_base=None):
        node = compose(config_name=f"engine/common/{option}").engine.common
    assert config_from_mapping(config_class, {**without_auto_keys(node), "name": "x"}) == config_class(name="x")
    hf_only = {"attn_implementation", "logprob_chunk_size", "wrap_layer_classes"}
    assert (hf_only <= set(node)) == (config_class is HFModuleEngineConfig)
    if config_class is EngineConfig:
        with pytest.raises(EngineConfigError, match="attn_implementation"):
            config_from_mapping(EngineConfig, {"name": "x", "attn_implementation": "eager"})


def test_capabilities_refuse_what_an_engine_cannot_do() -> None:
    with pytest.raises(EngineConfigError, match=r"'test_ddp' does not support mixed_precision \(param_dtype=bfloat16"):
        build_engine({"name": "test_ddp", "param_dtype": "bfloat16"}, "unused")
    build_engine({"name": "test_ddp", "param_dtype": "float32"}, "unused", model_kind="value")
    build_engine({"name": "fsdp2", "param_dtype": "bfloat16"}, "unused", model_kind="value")
