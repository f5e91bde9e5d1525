"""Test-only losses for the service's failure tests, registered through ``trainer.plugins`` (every worker imports it).

The SDK sends any ``loss_fn`` string, so a test can ask for these by name:
``test_raises`` fails inside the engine; ``test_sleeps`` writes its process id to the file named by
``$RLFLOW_TEST_PID_FILE`` and sleeps ``seconds`` before cross-entropy: a request long enough to kill its worker
in the middle of.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rlflow.service.losses import TINKER_LOSS_REGISTRY, cross_entropy


@TINKER_LOSS_REGISTRY.register("test_raises")
def raises(log_probs, micro, config):
    raise RuntimeError("the test loss fails on purpose")


@TINKER_LOSS_REGISTRY.register("test_sleeps", config={"seconds": 30.0})
def sleeps(log_probs, micro, config):
    Path(os.environ["RLFLOW_TEST_PID_FILE"]).write_text(str(os.getpid()))
    time.sleep(config["seconds"])
    return cross_entropy(log_probs, micro, config)
