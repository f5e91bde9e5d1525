"""Service entry point: ``python -m rlflow.service service.api_keys=[tml-...] service.models.NAME=/hf/folder``.

Everything a user can get wrong is checked before Ray starts: config keys and values, the base
model folders and their tokenizers, the checkpoint folder and the port. Then Ray starts and
uvicorn serves the app until interrupted; worker groups start when a client first needs them.
"""

from __future__ import annotations

import socket
from pathlib import Path

import uvicorn
from omegaconf import DictConfig

from rlflow.errors import UserError
from rlflow.service.app import build_app
from rlflow.service.catalogue import BaseModel, load_base_models
from rlflow.service.config import SERVICE_ENTRY
from rlflow.service.service import TinkerService
from rlflow.utils.logging import get_logger
from rlflow.utils.output_paths import check_output_folder
from rlflow.workers import init_cluster, shutdown_ray

logger = get_logger(__name__)


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise UserError(f"config key 'service.port': cannot listen on {host}:{port} ({error.strerror})") from None


def prepare(config: DictConfig) -> tuple[dict[str, BaseModel], Path]:
    """Everything checked before Ray starts, for a validated config: the base models (folders and tokenizers),
    the port; then the checkpoint folder is created. Returns the base models and that folder."""
    service_config = config.service
    try:
        catalogue = load_base_models(service_config.models)
    except (FileNotFoundError, ValueError) as error:
        raise UserError(f"config key 'service.models': {error}") from None
    _check_port(service_config.host, int(service_config.port))
    work_dir = check_output_folder(service_config.checkpoint_dir, "config key 'service.checkpoint_dir':").resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    return catalogue, work_dir


def serve(config: DictConfig) -> None:
    """Start Ray with a validated service config and serve until interrupted."""
    service_config = config.service
    catalogue, work_dir = prepare(config)
    trainer = config.trainer
    init_cluster(config.trainer)
    service = TinkerService(config, catalogue, work_dir)
    try:
        logger.info("rlflow service: serving %s at http://%s:%d", sorted(catalogue), service_config.host, service_config.port)
        uvicorn.run(build_app(service, list(service_config.api_keys)), host=service_config.host,
                    port=int(service_config.port), log_level="warning")
    finally:
        service.shutdown()
        shutdown_ray()


def main() -> None:
    SERVICE_ENTRY.run(serve)


if __name__ == "__main__":
    main()
