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

from hypothesis import settings  # noqa: E402

# No per-example deadline: with two test processes on two loaded cores an example's wall time says nothing.
settings.register_profile("rlflow", deadline=None)
settings.load_profile("rlflow")


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


# ---------------------------------------------------------------------------------------------------------
# `make test` runs the suite in two pytest-xdist processes (README.md): on a 2-core machine many tests
# keep only one core busy. Each test belongs to a group that runs whole in one process, so a fixture that
# costs minutes is built once: the files that need the reduced demo form the "demo" group, and every other
# test runs with its top-level folder (the folder's conftest fixtures). The demo group goes first: it is about
# 40% of the suite, and the other process shares out the rest meanwhile. The groups come from the node ids
# alone, because xdist's scheduler sees nothing else (and xdist's own `xdist_group` marks do not reach it
# under pytest 9.2); a test that asks for `demo` outside DEMO_PATHS stops the collection with the fix.
DEMO_GROUP = "demo"
DEMO_PATHS = ("tests/demo/", "tests/service/test_sdk", "tests/trainer/test_sft_main.py")  # test_sdk*.py


def xdist_group_of(nodeid: str) -> str:
    """A test's group: the demo's, or its top-level folder under tests/ (a file at the top: its own)."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(DEMO_PATHS):
        return DEMO_GROUP
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    strays = sorted({item.nodeid.split("::", 1)[0] for item in items
                     if "demo" in getattr(item, "fixturenames", ()) and xdist_group_of(item.nodeid) != DEMO_GROUP})
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)} use the demo fixture: add them to DEMO_PATHS in tests/conftest.py")
    items.sort(key=lambda item: xdist_group_of(item.nodeid) != DEMO_GROUP)  # stable: the demo group first


@pytest.hookimpl(optionalhook=True)  # a plain `pytest` where xdist is not installed skips it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's scope scheduler with the groups above as scopes, in collection order (the demo first)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

        def remove_node(self, node):
            """A crashed worker's test fails once; the rest of its group goes back to the queue.

            xdist's scope scheduler queues the crashed test again with its group, so a test that hangs until
            the timeout ends its process again in every replacement worker (eight by default: 80 minutes at
            a 600 s timeout). Marking it done first leaves one failure and one timeout.
            """
            crashed = next((nodeid for unit in self.assigned_work.get(node, {}).values()
                            for nodeid, done in unit.items() if not done), None)
            for unit in self.assigned_work.get(node, {}).values():
                if crashed in unit:
                    unit[crashed] = True
            rest = super().remove_node(node)
            return crashed if crashed is not None else rest

    config.option.loadscopereorder = False  # xdist would order scopes by test count: the demo group last
    return GroupScheduling(config, log)


# ---------------------------------------------------------------------------------------------------------
# A hard stop behind pytest-timeout. Its signal method (pytest.ini) fails a test at its timeout only once Python
# runs the signal handler, so a test stuck in C code that holds the GIL (a deadlocked extension) would hang the
# run until CI's own limit, with nothing printed. faulthandler's watchdog is a C thread: HARD_STOP_GRACE_S after
# a test's timeout it writes every thread's stack to the stderr the run started with and ends the process;
# xdist reports the test as crashed (and, above, does not run it again).
import faulthandler  # noqa: E402

HARD_STOP_GRACE_S = 30
_run_stderr = None  # a duplicate of the run's stderr, taken before pytest captures it


def pytest_configure(config: pytest.Config) -> None:
    global _run_stderr
    _run_stderr = os.fdopen(os.dup(2), "w")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    marker = item.get_closest_marker("timeout")
    timeout = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    if timeout > 0 and _run_stderr is not None:
        faulthandler.dump_traceback_later(timeout + HARD_STOP_GRACE_S, exit=True, file=_run_stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
