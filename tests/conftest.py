"""Test-wide settings: one torch thread per process (CI and dev boxes have 2 loaded cores)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------------------
# One reduced run of ``recipes/demo.sh`` per test session, shared by every test that needs its artefacts
# (tests/demo checks them and its before/after accuracy; the Tinker service's RL test starts from its SFT
# warm start). A failure is cached by pytest with the session fixture, so later tests report it without
# running the demo again.
import pytest  # noqa: E402
from demo_runner import KNOBS, DemoRun, run_demo_script  # noqa: E402


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> DemoRun:
    out = tmp_path_factory.mktemp("reduced_demo") / "demo"
    return DemoRun(out, run_demo_script(out, KNOBS, out.with_name("demo.log")), dict(KNOBS))
