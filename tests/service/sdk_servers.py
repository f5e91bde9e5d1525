"""The live servers of the SDK tests: one ``python -m rlflow.service`` per engine, shared by a test module.

Import ``services`` into a test module (a module-scoped fixture: each module that imports it gets its own
servers), and make SDK clients with ``sdk_service`` / ``sdk_client`` so the fixture closes their sessions
before the servers stop.
"""

from __future__ import annotations

import contextlib

import pytest
import tinker
from service_runner import API_KEY, start_service

RANK = 8
_OPEN_SERVICES: list[tinker.ServiceClient] = []


@pytest.fixture(scope="module")
def services(demo, tiny_model, tmp_path_factory):
    """A server per engine, started when a test first asks for it and stopped after this module."""
    started, stoppers = {}, []

    def get(engine: str):
        if engine not in started:
            runner = start_service(tmp_path_factory.mktemp(f"service-{engine}"), [
                f"engine={engine}", "rollout=vllm", f"service.models.tiny={tiny_model}",
                f"service.models.warm={demo.out / 'sft' / 'hf'}", "service.seq_gap_wait_s=2"])
            started[engine] = next(runner)
            stoppers.append(runner)
        return started[engine]

    yield get
    for service in _OPEN_SERVICES:  # finish the sessions while their servers still answer, or each
        with contextlib.suppress(Exception):  # heartbeat warns at exit (the killed worker's may fail)
            service.close("success").result(timeout=30)
    _OPEN_SERVICES.clear()
    for runner in stoppers:
        next(runner, None)


def sdk_service(server, api_key: str = API_KEY) -> tinker.ServiceClient:
    """An SDK client of ``server``; the ``services`` fixture closes it before the server stops."""
    service = tinker.ServiceClient(base_url=server.url, api_key=api_key)
    _OPEN_SERVICES.append(service)
    return service


def sdk_client(server, base_model: str = "tiny") -> tuple[tinker.ServiceClient, tinker.TrainingClient]:
    """An SDK client of ``server`` and a new LoRA training client of ``base_model`` (rank ``RANK``)."""
    service = sdk_service(server)
    return service, service.create_lora_training_client(base_model=base_model, rank=RANK).result()
