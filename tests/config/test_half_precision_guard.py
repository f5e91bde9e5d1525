"""bf16/fp16 compute on a CPU without native instructions is refused in config loading, before Ray starts.

The CPU is injected (``cpuinfo_samples``), so these hold on any machine: each compute dtype key
of each entry point is set in turn through ``compose_ppo_config`` / ``compose_sft_config`` (the
path ``main_ppo`` / ``main_sft`` run) and must fail with one line naming the key; the switch lets
it through; CUDA is never refused. The command line exits 2 with one line and starts no Ray.
The matmul timing is replaced here (its own test is in test_cpu_features.py) so the message's
number is known.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from one_line_errors import one_line_error
from cpuinfo_samples import AMX_SAPPHIRE_RAPIDS, AVX2_EPYC, AVX512_BF16_COOPER_LAKE

from rlflow.models.hf_checkpoint import DTYPES
from rlflow.config.loading import dtype_guard
from rlflow.trainer.entry_points import (
    PPO_ENGINE_MOUNTS,
    PPO_ENTRY,
    SFT_ENGINE_MOUNTS,
    SFT_ENTRY,
    compose_ppo_config,
    compose_sft_config,
)
from rlflow.utils import cpu_features

REPO = Path(__file__).resolve().parents[2]
PPO_KEYS = [entry.key for entry in dtype_guard.ppo_dtype_keys(PPO_ENGINE_MOUNTS)]
SFT_KEYS = [entry.key for entry in dtype_guard.sft_dtype_keys(SFT_ENGINE_MOUNTS)]
HALF = ["bf16", "bfloat16", "fp16", "float16"]  # every spelling, spread over the keys
FORCE = f"{dtype_guard.ALLOW_KEY}=true"


def _use_cpu(monkeypatch, cpuinfo: str, accelerator: bool = False) -> None:
    monkeypatch.setattr(cpu_features, "read_cpu_features", lambda: cpu_features.parse_cpuinfo(cpuinfo))
    monkeypatch.setattr(cpu_features, "measure_slowdown", lambda dtype: 27.0)
    monkeypatch.setattr(dtype_guard, "is_accelerator_available", lambda: accelerator)


@pytest.fixture
def avx2_cpu(monkeypatch):
    _use_cpu(monkeypatch, AVX2_EPYC)


@pytest.mark.parametrize(("compose", "key", "value"),
                         [(compose_ppo_config, key, HALF[i % 4]) for i, key in enumerate(PPO_KEYS)]
                         + [(compose_sft_config, key, HALF[i % 4]) for i, key in enumerate(SFT_KEYS)])
def test_each_half_precision_key_is_refused_on_a_cpu_without_it(avx2_cpu, compose, key, value):
    message = one_line_error(compose, [f"{key}={value}", "trainer.device=cpu"])
    dtype = "bfloat16" if value.startswith("b") else "float16"
    assert message.startswith(f"config key '{key}': {dtype} compute is refused on this CPU (AMD EPYC)"), message
    assert "27x slower than float32" in message and FORCE in message, message


def test_auto_device_on_a_machine_without_a_gpu_is_the_cpu(avx2_cpu):
    assert "actor.engine.param_dtype" in one_line_error(compose_ppo_config, ["actor.engine.param_dtype=bf16"])
    assert "'engine.dtype'" in one_line_error(compose_sft_config, ["engine.dtype=bf16", "engine.param_dtype=bf16"])


def _all_half(keys: list[str]) -> list[str]:
    return [f"{key}=bf16" for key in keys]


def test_the_switch_lets_every_key_through(avx2_cpu):
    config = compose_ppo_config([*_all_half(PPO_KEYS), "trainer.device=cpu", FORCE])
    assert config.rollout.dtype == "bf16" and config.actor.engine.param_dtype == "bf16"
    assert compose_sft_config([*_all_half(SFT_KEYS), "trainer.device=cpu", FORCE]).engine.dtype == "bf16"


def test_cuda_is_never_refused(monkeypatch):
    _use_cpu(monkeypatch, AVX2_EPYC, accelerator=True)
    compose_ppo_config([*_all_half(PPO_KEYS), "trainer.device=cuda"])
    compose_ppo_config(_all_half(PPO_KEYS))  # auto with a visible GPU
    compose_sft_config([*_all_half(SFT_KEYS), "trainer.device=cuda"])
    _use_cpu(monkeypatch, AVX2_EPYC, accelerator=False)
    compose_ppo_config([*_all_half(PPO_KEYS), "trainer.device=cuda"])  # explicit cuda, whatever the driver sees


def test_an_engines_own_device_decides_for_its_keys(avx2_cpu):
    compose_ppo_config(["trainer.device=cpu", "actor.engine.device=cuda", "actor.engine.param_dtype=bf16"])
    message = one_line_error(compose_ppo_config, ["trainer.device=cuda", "ref.engine.device=cpu", "ref.engine.dtype=fp16",
                                            "actor.engine.param_dtype=bf16"])
    assert message.startswith("config key 'ref.engine.dtype'"), message


def test_joining_a_cluster_with_auto_device_is_not_judged_by_this_cpu(avx2_cpu):
    compose_ppo_config([*_all_half(PPO_KEYS), "trainer.ray_address=auto"])


def test_native_cpus_pass_and_fp16_needs_its_own_instructions(monkeypatch):
    _use_cpu(monkeypatch, AMX_SAPPHIRE_RAPIDS)
    compose_ppo_config([*_all_half(PPO_KEYS), "rollout.dtype=fp16", "trainer.device=cpu"])
    _use_cpu(monkeypatch, AVX512_BF16_COOPER_LAKE)
    compose_ppo_config([*_all_half(PPO_KEYS), "trainer.device=cpu"])
    assert "'rollout.dtype': float16" in one_line_error(compose_ppo_config, ["rollout.dtype=fp16", "trainer.device=cpu"])


def test_reduce_dtype_and_fp32_are_not_compute_settings(avx2_cpu):
    compose_ppo_config(["actor.engine.reduce_dtype=bf16", "rollout.dtype=fp32", "trainer.device=cpu"])


@pytest.mark.parametrize(("entry", "keys"), [(PPO_ENTRY, PPO_KEYS), (SFT_ENTRY, SFT_KEYS)])
def test_every_dtype_choice_but_the_reduction_is_guarded(entry, keys):
    dtype_keys = {choice.key for choice in entry.choices() if choice.names is DTYPES}
    assert {key for key in dtype_keys if not key.endswith(".reduce_dtype")} == set(keys)


CLI = """
import sys
from rlflow.utils import cpu_features
cpu_features.read_cpu_features = lambda: cpu_features.parse_cpuinfo({cpuinfo!r})
sys.argv = ["main_ppo", *{argv!r}]
from rlflow.trainer.main_ppo import main
main()
"""


def test_cli_exits_2_with_one_line_before_ray_starts(tmp_path):
    ray_dir = tmp_path / "ray"
    argv = ["rollout.dtype=bfloat16", "trainer.device=cpu", f"trainer.ray_temp_dir={ray_dir}",
            f"trainer.default_local_dir={tmp_path / 'run'}", f"model.path={tmp_path / 'model'}"]
    result = subprocess.run([sys.executable, "-c", CLI.format(cpuinfo=AVX2_EPYC, argv=argv)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config key 'rollout.dtype': bfloat16 compute is refused"), lines
    assert "slower than float32" in lines[0] and FORCE in lines[0]
    assert not ray_dir.exists() and not (tmp_path / "model").exists() and not (tmp_path / "run").exists()
