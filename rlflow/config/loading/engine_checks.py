"""What a configured engine node must satisfy, checked before any worker starts.

Three questions, each answered by the engine class registered under the node's ``name``: which
config class validates the node (``engine_schema_resolver``), whether the engine supports what
the node's options ask for (``check_engine_supports``: LoRA, mixed precision, an adapter folder, a
tensor-parallel group within a node),
and, once the model folder exists, whether it can run that model on the run's ranks
(``check_engine_fits``). Each failure is one ``ConfigError`` line naming the mount key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from rlflow.config import ConfigError
from rlflow.engines.common.forward.lora import check_adapter_folder
from rlflow.engines.config import EngineConfigError, config_from_mapping
from rlflow.engines.registry import ENGINE_REGISTRY, check_engine_model

__all__ = ["check_engine_fits", "check_engine_supports", "engine_schema_resolver"]


def engine_schema_resolver(mount: str) -> Callable[[DictConfig], type]:
    """The function ``validate_config`` calls on the engine node at ``mount``: its engine's config class."""

    def resolve(node: DictConfig) -> type:
        if node.get("name") is None:
            raise ConfigError(f"config key '{mount}.name': no engine named (the node was deleted or emptied on the "
                              f"command line?); pick one with {mount}=NAME")
        try:
            return ENGINE_REGISTRY.get(str(node.get("name")), config_key=f"{mount}.name").config_class
        except EngineConfigError as error:
            raise ConfigError(str(error)) from None

    return resolve


def check_engine_supports(config: DictConfig, mount: str) -> None:
    """The engine at ``mount`` supports what its options ask for (``BaseEngine.check_supported``), else one line."""
    node = OmegaConf.select(config, mount)
    engine_class = ENGINE_REGISTRY.get(str(node.name), config_key=f"{mount}.name")
    try:
        engine_config = config_from_mapping(engine_class.config_class, node)
        engine_class.check_supported(engine_config)
        _check_within_a_node(engine_class.node_local_ranks(engine_config), config.trainer)
        if engine_config.lora.enabled and engine_config.lora.adapter_path:
            check_adapter_folder(engine_config.lora)
    except EngineConfigError as error:
        raise ConfigError(f"config key '{mount}': {error}") from None


def _check_within_a_node(local_ranks: int, cluster: Any) -> None:
    """Ranks are node-contiguous, so a group of ``local_ranks`` adjacent ranks stays on one node when it divides the
    processes of a node."""
    if cluster.nnodes > 1 and cluster.n_procs_per_node % local_ranks:
        raise EngineConfigError(
            f"its groups of {local_ranks} ranks that exchange activations in every layer (tensor or sequence "
            f"parallelism) would span nodes: trainer.n_procs_per_node={cluster.n_procs_per_node} is not a multiple of "
            f"{local_ranks}; keep each group within a node")


def check_engine_fits(config: Any, mount: str, model_path: str | Path, model_kind: str, world_size: int) -> None:
    """The engine at ``mount`` can run ``model_path`` on ``world_size`` ranks (``BaseEngine.check_model``) with its
    tensor- and sequence-parallel groups within a node, else one ``ConfigError`` line naming the key; called once the model folder
    exists and before any worker starts (for every role: config loading checks the policy's alone)."""
    node = OmegaConf.to_container(OmegaConf.select(config, mount), resolve=True)
    try:
        check_engine_model(node, model_path, model_kind, world_size)
        engine_class = ENGINE_REGISTRY.get(str(node["name"]), config_key=f"{mount}.name")
        _check_within_a_node(engine_class.node_local_ranks(config_from_mapping(engine_class.config_class, node)),
                             config.trainer)
    except EngineConfigError as error:
        raise ConfigError(f"config key '{mount}': {error}") from None
