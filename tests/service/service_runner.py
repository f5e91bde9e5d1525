"""A live Tinker service for the SDK tests: ``python -m rlflow.service`` in a subprocess, as a user starts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

from rlflow.workers.worker import find_free_port

REPO = Path(__file__).resolve().parents[2]
API_KEY = "tml-rlflow-test"
SECOND_API_KEY = "tml-rlflow-second"  # another account (rlflow.service.accounts)
PLUGIN = Path(__file__).with_name("service_plugin.py")
START_TIMEOUT_S = 180


class ServiceProcess:
    """A running ``python -m rlflow.service``: its base URL and its output so far."""

    def __init__(self, overrides: list[str], log_path: Path) -> None:
        self.checkpoint_dir = log_path.with_name("checkpoints")
        self.pid_file = log_path.with_name("test_sleeps.pid")  # service_plugin's test_sleeps loss writes its pid here
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        args = [sys.executable, "-m", "rlflow.service", f"service.port={self.port}", f"service.api_keys=[{API_KEY},{SECOND_API_KEY}]",
                *overrides]
        self._log = log_path.open("w")
        self.process = subprocess.Popen(args, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "RLFLOW_TEST_PID_FILE": str(self.pid_file)}, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the service exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/api/v1/healthz", headers={"X-API-Key": API_KEY}, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the service did not answer in {START_TIMEOUT_S} s:\n{self.log()[-4000:]}")

    def checkpoint_folder(self, path: str) -> Path:
        """The folder a ``tinker://<model id>/<kind>/<name>`` path of this server names (docs/service.md)."""
        model_id, kind, name = path.removeprefix("tinker://").split("/")
        return self.checkpoint_dir / model_id.replace(":", "_") / kind / name

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)  # uvicorn stops, the service shuts its worker groups and Ray down
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


def start_service(tmp_path: Path, overrides: list[str]) -> Iterator[ServiceProcess]:
    """Start a service with ``overrides`` (plus a port, the test key and the test plugin); stop it after."""
    server = ServiceProcess([f"service.checkpoint_dir={tmp_path / 'checkpoints'}", f"trainer.plugins=[{PLUGIN}]",
                             *overrides], tmp_path / "service.log")
    try:
        yield server
    finally:
        server.stop()
