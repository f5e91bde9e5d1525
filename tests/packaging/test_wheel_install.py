"""A wheel of rlflow, installed non-editable into a fresh venv, runs its console scripts outside the repo.

The wheel is built from a copy of ``setup.py`` and ``rlflow/`` (the build writes ``build/`` and
``*.egg-info`` next to its sources, so the repo stays untouched). The fresh venv reuses the project
venv's installed dependencies through one ``.pth`` line naming its site-packages: a folder added
that way is put on ``sys.path`` but its own ``.pth`` files are not processed, so the project's
editable-install finder stays off and ``import rlflow`` can only find the wheel's copy (checked).
Every command then runs from a folder outside the repo with no ``PYTHONPATH``: the Hydra configs
must come from the installed package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlflow.data.tasks import build_task, write_task_files

REPO = Path(__file__).resolve().parents[2]
DIST_NAME = "rlflow_llm"  # the wheel's file name spells the distribution name "rlflow-llm" this way
SFT_STEPS = 1


@dataclass(frozen=True)
class WheelVenv:
    """A venv holding only the built wheel (plus a path to the project's dependencies), and a folder to run in."""

    venv: Path
    workdir: Path

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(args, cwd=self.workdir, env=env, capture_output=True, text=True, timeout=timeout)


def _checked(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{result.args}: exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


def _build_wheel(scratch: Path) -> Path:
    source = scratch / "source"
    source.mkdir()
    shutil.copy2(REPO / "setup.py", source / "setup.py")
    shutil.copytree(REPO / "rlflow", source / "rlflow", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _checked(subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(scratch / "dist"),
         str(source)], capture_output=True, text=True, timeout=300))
    (wheel,) = (scratch / "dist").glob(f"{DIST_NAME}-*.whl")
    return wheel


def _fresh_venv(path: Path) -> Path:
    _checked(subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], capture_output=True,
                            text=True, timeout=120))
    site_packages = Path(subprocess.run(
        [str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    project_dirs = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site_packages / "project_dependencies.pth").write_text("".join(f"{d}\n" for d in project_dirs))
    return path


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    scratch = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(scratch)
    venv = _fresh_venv(scratch / "venv")
    _checked(subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                             str(wheel)], capture_output=True, text=True, timeout=300))
    workdir = scratch / "elsewhere"
    workdir.mkdir()
    return WheelVenv(venv, workdir)


PROBE = """
import json, rlflow, rlflow.config.loading.hydra_entry as entry
from importlib.metadata import distribution
scripts = {ep.name: ep.load().__module__ for ep in distribution("rlflow-llm").entry_points if ep.group == "console_scripts"}
print(json.dumps({"module": rlflow.__file__, "configs": entry.CONFIG_DIR, "scripts": scripts}))
"""


def test_the_wheel_is_the_rlflow_that_imports_and_ships_configs_and_scripts(wheel_venv: WheelVenv) -> None:
    probe = json.loads(_checked(wheel_venv.run(["python", "-c", PROBE], timeout=180)).stdout)
    module_file, config_dir = Path(probe["module"]), Path(probe["configs"])
    assert module_file.is_relative_to(wheel_venv.venv), f"rlflow imported from {module_file}, not the wheel"
    shipped = sorted(p.relative_to(config_dir) for p in config_dir.rglob("*.yaml"))
    in_repo = sorted(p.relative_to(REPO / "rlflow" / "configs") for p in (REPO / "rlflow" / "configs").rglob("*.yaml"))
    assert shipped == in_repo
    assert {"rlflow-ppo", "rlflow-sft", "rlflow-eval", "rlflow-data", "rlflow-export", "rlflow-service"} <= set(probe["scripts"])  # each one's target imported
    assert all((wheel_venv.venv / "bin" / name).is_file() for name in probe["scripts"])


def test_rlflow_ppo_prints_its_composed_job_config(wheel_venv: WheelVenv) -> None:
    result = _checked(wheel_venv.run(["rlflow-ppo", "--cfg", "job", "algorithm=ppo", "rollout=hf"], timeout=180))
    assert "adv_estimator: gae" in result.stdout  # from algorithm/ppo.yaml, a group option of the shipped configs
    assert "actor:" in result.stdout and "rollout:" in result.stdout


@pytest.mark.timeout(400)
def test_rlflow_sft_trains_one_step_outside_the_repo(wheel_venv: WheelVenv) -> None:
    """One SFT step of the tiny preset, built by the installed package on first use, one process (no Ray)."""
    files = write_task_files(build_task("addition", digits=2), wheel_venv.workdir / "data", n_train=16, n_val=4, seed=0)
    result = _checked(wheel_venv.run([
        "rlflow-sft",
        "trainer.launcher=torchrun",  # without torchrun's environment: a one-process run of the same loop
        "trainer.device=cpu",
        f"trainer.total_training_steps={SFT_STEPS}",
        f"data.train_files=[{files['sft_train']}]",
        "data.val_files=[]",
        "data.train_batch_size=8",
        "engine.lr_scheduler.name=constant",
        "trainer.logger=[jsonl]",
        "trainer.default_local_dir=run",
    ], timeout=360))
    run_dir = wheel_venv.workdir / "run"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == [SFT_STEPS], result.stdout[-2000:]
    assert (run_dir / "hf" / "model.safetensors").is_file()
    assert (wheel_venv.workdir / "outputs" / "models" / "tiny" / "config.json").is_file()
