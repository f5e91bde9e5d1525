"""Fixtures of the service tests (the server itself: service_runner.py; SDK clients of it: sdk_servers.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from sdk_servers import OPEN_SERVICES
from service_runner import start_service

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_preset(tmp_path_factory.mktemp("service-preset") / "tiny", tokenizer_corpus(), preset="tiny", seed=0)


@pytest.fixture(scope="package")
def services(demo, tiny_model, tmp_path_factory):
    """A server per engine, started when a test first asks for it and shared by the SDK test modules (they run
    in one pytest-xdist group, tests/conftest.py: test_sdk.py, test_sdk_api.py, then test_sdk_faults.py, whose
    last test kills a worker). Package scope: the servers stop when that worker leaves tests/service/, so their
    processes do not load the machine for the rest of the run."""
    started, stoppers = {}, []

    def get(engine: str):
        if engine not in started:
            runner = start_service(tmp_path_factory.mktemp(f"service-{engine}"), [
                f"engine={engine}", "rollout=vllm", f"service.models.tiny={tiny_model}",
                f"service.models.warm={demo.out / 'sft' / 'hf'}", "service.seq_gap_wait_s=2",
                # tiny and warm with LoRA rank 8, and tiny fully fine-tuned: three groups on the 2-core machine
                "service.max_hosts=3", "trainer.cpus_per_proc=0.5"])
            started[engine] = next(runner)
            stoppers.append(runner)
        return started[engine]

    yield get
    for service in OPEN_SERVICES:  # finish the sessions while their servers still answer, or each
        with contextlib.suppress(Exception):  # heartbeat warns at exit (the killed worker's may fail)
            service.close("success").result(timeout=30)
    OPEN_SERVICES.clear()
    for runner in stoppers:
        next(runner, None)
