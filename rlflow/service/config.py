"""The Tinker service's config: its schema, and its validation before Ray starts.

``rlflow/configs/service.yaml`` is merged into ``ServiceAppConfig``, the ``engine`` node into the
chosen engine's own config class, exactly as the trainers do (``load_entry_config``). Then the
service's own checks: at least one API key, each in the SDK's ``tml-`` form, at least one base
model, and an engine that trains LoRA adapters. ``check_service_inputs`` checks what lies outside
the config (the base model folders and their tokenizers, the port); ``--validate`` runs it and
asks whether the checkpoint folder could be created, creating nothing.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from omegaconf import DictConfig

from rlflow.config import ConfigError
from rlflow.config.loading.auto_settings import RunKeys
from rlflow.config.loading.choices import Choice, mounted_engine_choices, rollout_choices
from rlflow.config.loading.dtype_guard import ppo_dtype_keys
from rlflow.config.loading.entry_point import EntryPoint
from rlflow.config.loading.rollout_memory import check_rollout_memory
from rlflow.config.ranges import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, Ranges
from rlflow.config.schema import ClusterConfig, RolloutConfig
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.errors import UserError
from rlflow.rollout.sampling import check_rollout_sampling
from rlflow.service.catalogue import BaseModel, load_base_models
from rlflow.utils.device import DEVICES
from rlflow.utils.output_paths import folder_write_problem
from rlflow.workers.ray_connect import check_cluster_reachable

ENGINE_MOUNTS = ("engine",)
API_KEY_PREFIX = "tml-"  # the SDK refuses any other key before it sends a request


@dataclass
class ServiceSection:
    """``service.*``: where it listens, who may call it, what it serves, and its limits."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[str] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)  # base model name -> local HF folder
    checkpoint_dir: str = "outputs/service"
    max_seq_len: int = 512
    max_hosts: int = 2
    lora_alpha: float = 32.0
    seq_gap_wait_s: float = 10.0
    gradient_hold_s: float = 60.0
    max_sample_batch: int = 256
    max_queued_requests: int = 512
    poll_wait_s: float = 25.0
    keep_result_s: float = 300.0
    expire_result_s: float = 3600.0

    RANGES: ClassVar[Ranges] = {
        "port": Range(1, 65535), "max_seq_len": Range(2, note="a prompt token and a response token"),
        "max_hosts": AT_LEAST_1, "lora_alpha": POSITIVE, "seq_gap_wait_s": NON_NEGATIVE, "gradient_hold_s": NON_NEGATIVE,
        "max_sample_batch": Range(1, note="1: each sampling request alone"), "max_queued_requests": AT_LEAST_1, "poll_wait_s": NON_NEGATIVE,
        "keep_result_s": NON_NEGATIVE, "expire_result_s": NON_NEGATIVE,
    }


@dataclass
class ServiceAppConfig:
    """The whole ``python -m rlflow.service`` config (rlflow/configs/service.yaml)."""

    service: ServiceSection = field(default_factory=ServiceSection)
    engine: Any = None
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: ClusterConfig = field(default_factory=ClusterConfig)  # where the worker groups run


def _service_choices() -> list[Choice]:
    """Every choice key of the service's config."""
    return [Choice("trainer.device", DEVICES, "device"), *rollout_choices(), *mounted_engine_choices(ENGINE_MOUNTS)]


def _check_service(config: DictConfig) -> None:
    service = config.service
    if not service.api_keys:
        raise ConfigError("config key 'service.api_keys': set at least one key, e.g. service.api_keys=[tml-mykey]")
    bad = [key for key in service.api_keys if not str(key).startswith(API_KEY_PREFIX)]
    if bad:
        raise ConfigError(f"config key 'service.api_keys': keys must start with {API_KEY_PREFIX!r} (the tinker SDK "
                          f"sends no other), got {len(bad)} that do not")
    if not service.models:
        raise ConfigError("config key 'service.models': name at least one base model, e.g. service.models.tiny=/path/to/hf")
    if int(config.rollout.tensor_parallel_size) > 1:
        raise ConfigError("config key 'rollout.tensor_parallel_size': the service runs each base model's rollout beside "
                          "its trainer in one worker process, on that process's one device; leave it 1")
    if not config.rollout.calculate_log_probs:
        raise ConfigError("config key 'rollout.calculate_log_probs': the service's samples carry each token's log-prob "
                          "(Tinker's SampleResponse); leave it true")
    ENGINE_REGISTRY.get(str(config.engine.name), config_key="engine.name")  # an engine without LoRA: rank-0 clients only


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise UserError(f"config key 'service.port': cannot listen on {host}:{port} ({error.strerror})") from None


def check_service_inputs(config: DictConfig) -> dict[str, BaseModel]:
    """The base model folders and their tokenizers, and the port, for a validated config; returns the base models."""
    service_config = config.service
    try:
        catalogue = load_base_models(service_config.models)
    except (FileNotFoundError, ValueError) as error:
        raise UserError(f"config key 'service.models': {error}") from None
    _check_port(service_config.host, int(service_config.port))
    return catalogue


def _preflight(config: DictConfig) -> None:
    """``--validate``: ``check_service_inputs``, and whether the checkpoint folder could be created (nothing is)."""
    check_service_inputs(config)
    problem = folder_write_problem(config.service.checkpoint_dir)
    if problem is not None:
        raise ConfigError(f"config key 'service.checkpoint_dir': {config.service.checkpoint_dir} cannot be written: {problem}")


def _check_cluster(config: DictConfig) -> None:
    check_cluster_reachable(config.trainer)


# A service has no run length; its clients sample one row per prompt.
SERVICE_RUN_KEYS = RunKeys(steps=None, rollout="rollout")

SERVICE_ENTRY = EntryPoint(
    config_name="service",
    schema=ServiceAppConfig,
    choices=_service_choices,
    dtype_keys=lambda: ppo_dtype_keys(ENGINE_MOUNTS),
    engine_mounts=ENGINE_MOUNTS,
    group_shorthands={"engine": "engine"},  # engine=fsdp picks rlflow/configs/engine/fsdp.yaml
    free_form_mappings=("service.models",),  # service.models.NAME=/folder adds a base model
    checks=(_check_service, check_rollout_memory, check_rollout_sampling),
    machine_checks=(_check_cluster,),
    preflight=_preflight,
    run_keys=SERVICE_RUN_KEYS,
)


def compose_service_config(overrides: Sequence[str]) -> DictConfig:
    """The validated config ``python -m rlflow.service`` builds from these command-line overrides, composed in-process."""
    return SERVICE_ENTRY.compose(overrides)
