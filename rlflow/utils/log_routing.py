"""Where the libraries' log records go: a log file in the run folder at INFO, the console only at WARNING and up.

vLLM, Ray, transformers and friends log many INFO lines per worker; forwarded to the driver's
console by Ray they buried the progress bar (854 lines for ``make demo``, 488 of them vLLM's). A
worker process calls ``route_library_logs`` when it starts: the root logger then writes INFO and
above to ``<RLFLOW_LOG_DIR>/<process>.log`` (the driver sets ``RLFLOW_LOG_DIR`` to
``<trainer.default_local_dir>/logs`` for its workers) and WARNING and above to the console.
rlflow's own lines (the ``rlflow`` logger) keep their console handler and go to the file too.
``RLFLOW_CONSOLE_LOG_LEVEL=INFO`` (or DEBUG) puts every library line back on the console.
``LIBRARY_ENV`` is what worker processes need in their environment before the libraries are
imported (vLLM configures its own console handler at import unless told not to).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

ENV_LOG_DIR = "RLFLOW_LOG_DIR"
ENV_CONSOLE_LEVEL = "RLFLOW_CONSOLE_LOG_LEVEL"
DEFAULT_CONSOLE_LEVEL = "WARNING"
LOG_FOLDER = "logs"  # under trainer.default_local_dir
LIBRARY_ENV = {"VLLM_CONFIGURE_LOGGING": "0"}  # vLLM's loggers propagate to the root logger's handlers
_FORMAT = "%(asctime)s %(levelname).1s [%(name)s] %(message)s"
_ROUTED_FLAG = "_rlflow_routed"


def console_level() -> str:
    """The level from which library records reach the console: ``RLFLOW_CONSOLE_LOG_LEVEL``, default WARNING."""
    return os.environ.get(ENV_CONSOLE_LEVEL, DEFAULT_CONSOLE_LEVEL).upper()


def route_library_logs(process_name: str) -> Optional[Path]:
    """Send this process's log records to the console from ``console_level()`` and, when ``RLFLOW_LOG_DIR`` is set,
    to ``<RLFLOW_LOG_DIR>/<process_name>.log`` from INFO; returns that file (None without one). Idempotent."""
    root = logging.getLogger()
    if getattr(root, _ROUTED_FLAG, None) is not None:
        return getattr(root, _ROUTED_FLAG) or None
    formatter = logging.Formatter(_FORMAT, datefmt="%H:%M:%S")
    level = console_level()
    root.setLevel(min(logging.INFO, logging.getLevelName(level)))
    console = logging.StreamHandler()
    console.setLevel(level)
    console.setFormatter(formatter)
    root.addHandler(console)
    log_file = None
    if os.environ.get(ENV_LOG_DIR):
        log_file = Path(os.environ[ENV_LOG_DIR]) / f"{process_name}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file)
        handler.setLevel(logging.INFO)
        handler.setFormatter(formatter)
        root.addHandler(handler)
        logging.getLogger("rlflow").addHandler(handler)
    setattr(root, _ROUTED_FLAG, log_file or "")
    return log_file


def worker_log_env(run_folder: str | Path) -> dict[str, str]:
    """The environment that sends a run's worker logs to ``<run_folder>/logs`` (see the module doc)."""
    return {ENV_LOG_DIR: str(Path(run_folder).expanduser().resolve() / LOG_FOLDER)}
