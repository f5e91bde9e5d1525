"""Library log records reach the console from WARNING and the run folder's log file from INFO; an environment
variable brings them all back to the console; vLLM's per-sync rotary warning is dropped where vLLM logs it; the
CPU worker's C++ NUMA-binding notice goes to the log, not to stderr.

Each case runs in a fresh interpreter: the routing configures the process's root logger once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlflow.rollout.vllm_log_filters import drop_expected_vllm_warnings

_EMIT = textwrap.dedent("""
    import logging
    from rlflow.utils.log_routing import route_library_logs
    print(route_library_logs("worker_0"), flush=True)
    library = logging.getLogger("vllm.engine")
    library.info("library info line")
    library.warning("library warning line")
    logging.getLogger("rlflow.trainer").warning("rlflow warning line")
""")


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RLFLOW_")}
    return subprocess.run([sys.executable, "-c", _EMIT], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120, check=True, cwd=Path(__file__).resolve().parents[2])


def test_library_info_goes_to_the_run_folder_file_and_only_warnings_to_the_console(tmp_path):
    done = _run({"RLFLOW_LOG_DIR": str(tmp_path / "logs")})
    log_file = tmp_path / "logs" / "worker_0.log"
    assert done.stdout.strip() == str(log_file)
    assert "library warning line" in done.stderr and "library info line" not in done.stderr
    text = log_file.read_text()
    assert "library info line" in text and "library warning line" in text and "rlflow warning line" in text


@pytest.mark.parametrize("level", ["INFO", "debug"])
def test_the_console_level_variable_brings_every_line_back(tmp_path, level):
    done = _run({"RLFLOW_CONSOLE_LOG_LEVEL": level})
    assert done.stdout.strip() == "None"  # no RLFLOW_LOG_DIR: no file
    assert "library info line" in done.stderr and "library warning line" in done.stderr


def test_the_rotary_reload_warning_is_dropped_and_other_layers_are_not(caplog):
    drop_expected_vllm_warnings()
    reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    with caplog.at_level(logging.WARNING, logger=reload_logger.name):
        for layer in ("RotaryEmbedding", "Llama3RotaryEmbedding", "QKVParallelLinear"):
            reload_logger.warning("%s: Failed to load weights", layer)
    assert [record.getMessage() for record in caplog.records] == ["QKVParallelLinear: Failed to load weights"]


def test_per_run_notices_are_demoted_to_info_and_other_warnings_stay(caplog):
    drop_expected_vllm_warnings()
    platform = logging.getLogger("vllm.platforms.cpu")
    with caplog.at_level(logging.INFO, logger=platform.name):
        platform.warning("Triton is not installed. triton-cpu is expected on x86 CPUs.")
        platform.warning("KV cache is too small")
    assert [(record.levelname, record.getMessage()[:21]) for record in caplog.records] == \
        [("INFO", "Triton is not install"), ("WARNING", "KV cache is too small")]


_NUMA = textwrap.dedent("""
    import logging, sys
    import torch
    from rlflow.rollout import vllm_cpu_compat
    record = logging.StreamHandler(sys.stdout)
    record.setFormatter(logging.Formatter("RECORD %(name)s %(levelname)s %(message)s"))
    vllm_cpu_compat.CPU_WORKER_LOGGER.addHandler(record)
    vllm_cpu_compat.CPU_WORKER_LOGGER.setLevel(logging.INFO)  # vLLM's level for its loggers
    with vllm_cpu_compat.numa_notice_to_log():  # as VLLMRollout enters it: vLLM's kernels not loaded yet
        torch.ops._C.init_cpu_memory_env([0])  # what vLLM's CPUWorker calls as it starts
    torch.ops._C.init_cpu_memory_env([0])  # restored: the notice reaches stderr again
""")


def test_the_cpu_worker_numa_notice_is_a_log_record_of_vllms_cpu_worker_while_an_engine_starts():
    done = subprocess.run([sys.executable, "-c", _NUMA], capture_output=True, text=True, timeout=120, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    records = [line for line in done.stdout.splitlines() if line.startswith("RECORD ") and "NUMA binding" in line]
    assert records and records[0].startswith("RECORD vllm.v1.worker.cpu_worker INFO "), done.stdout
    printed = [line for line in done.stderr.splitlines() if "NUMA binding" in line and not line.startswith("RECORD")]
    assert len(printed) == 1 and printed[0].startswith("[W"), done.stderr  # only the call outside the context
