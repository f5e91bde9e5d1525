"""Service entry point: ``python -m rlflow.service service.api_keys=[tml-...] service.models.NAME=/hf/folder``.

Everything a user can get wrong is checked before Ray starts: config keys and values, the base
model folders and their tokenizers, the checkpoint folder and the port. Then Ray starts and
uvicorn serves the app until interrupted; worker groups start when a client first needs them.
"""

from __future__ import annotations

from pathlib import Path

import uvicorn
from omegaconf import DictConfig

from rlflow.service.app import build_app
from rlflow.service.catalogue import BaseModel
from rlflow.config.loading.auto_settings import speed_settings_line
from rlflow.service.config import SERVICE_ENTRY, SERVICE_RUN_KEYS, check_service_inputs
from rlflow.service.service import TinkerService
from rlflow.utils.logging import get_logger
from rlflow.utils.output_paths import check_output_folder
from rlflow.workers import init_cluster, shutdown_ray

logger = get_logger(__name__)


def prepare(config: DictConfig) -> tuple[dict[str, BaseModel], Path]:
    """Everything checked before Ray starts, for a validated config: the base models (folders and tokenizers),
    the port; then the checkpoint folder is created. Returns the base models and that folder."""
    catalogue = check_service_inputs(config)
    work_dir = check_output_folder(config.service.checkpoint_dir, "config key 'service.checkpoint_dir':").resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    logger.info(speed_settings_line(config, ["engine"], SERVICE_RUN_KEYS))
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
