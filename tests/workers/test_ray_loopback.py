"""A local cluster started by ``init_ray`` listens on loopback only and demands a token.

``ray_listeners.py`` runs in a fresh process with the ``RAY_AUTH_*`` variables removed, so
the defaults are what is tested (the suite's own session may run under a user's settings).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from listening_sockets import is_loopback

# Ray processes allowed to listen on a non-loopback address, with the reason: none in Ray 2.60.
# Keep in sync with docs/reliability/security.md.
ALLOWED_NON_LOOPBACK: dict[str, str] = {}


def test_is_loopback_reads_mapped_and_wildcard_addresses():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not any(is_loopback(ip) for ip in ("0.0.0.0", "::", "192.0.2.2", "::ffff:10.0.0.1"))


def test_local_cluster_binds_every_port_to_loopback_and_requires_a_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
    script = Path(__file__).with_name("ray_listeners.py")
    report_path = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(script), str(report_path)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())

    assert report["node_ip"] == "127.0.0.1"
    names = {entry["name"] for entry in report["listeners"]}
    assert {"gcs_server", "raylet"} <= names, report["listeners"]  # the scan does see the cluster
    exposed = [e for e in report["listeners"] if not is_loopback(e["ip"]) and e["name"] not in ALLOWED_NON_LOOPBACK]
    assert not exposed, f"Ray processes listening beyond loopback: {exposed}"
    assert report["tokenless_gcs_call"] == "UNAUTHENTICATED"


_AUTH_ROUND_TRIP = """
import os
from rlflow.workers.ray_security import ClusterAuth
auth = ClusterAuth()
mode = auth.enable()
print(mode, os.environ.get("RAY_AUTH_MODE"), len(os.environ.get("RAY_AUTH_TOKEN", "")))
auth.restore()
print(os.environ.get("RAY_AUTH_MODE"), os.environ.get("RAY_AUTH_TOKEN"))
"""


def test_cluster_auth_sets_a_fresh_token_only_when_the_user_chose_nothing_and_restores():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
    run = lambda extra: subprocess.run([sys.executable, "-c", _AUTH_ROUND_TRIP], env={**env, **extra},  # noqa: E731
                                       capture_output=True, text=True, timeout=120, check=True).stdout.split("\n")
    assert run({})[:2] == ["token token 64", "None None"]
    assert run({"RAY_AUTH_MODE": "disabled"})[:2] == ["disabled disabled 0", "disabled None"]
    assert run({"RAY_AUTH_TOKEN": "mine"})[:2] == ["token token 4", "None mine"]
