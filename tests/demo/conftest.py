"""One reduced run of ``recipes/demo.sh`` per test session, shared by the tests of this folder.

``test_demo_pipeline.py`` checks its artefacts and ``test_grpo_learns.py`` its before/after
accuracy. A failure is cached by pytest with the session fixture, so the second test reports it
without running the demo again.
"""

from __future__ import annotations

import pytest
from demo_runner import KNOBS, DemoRun, run_demo_script


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> DemoRun:
    out = tmp_path_factory.mktemp("reduced_demo") / "demo"
    return DemoRun(out, run_demo_script(out, KNOBS), dict(KNOBS))
