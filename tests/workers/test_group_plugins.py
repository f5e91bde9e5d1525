"""A worker group's processes import the driver's plugins before they build any role."""

from __future__ import annotations

import os
import sys

import pytest
from sample_workers import ProbeWorker

from rlflow.utils import plugins
from rlflow.workers import RayWorkerGroup, ResourcePool, WorkerUserError

ROLE_PLUGIN = """
import os

from rlflow.utils.plugins import loaded_plugins


class PluginRole:
    def where(self):
        return os.getpid(), loaded_plugins()
"""


@pytest.fixture(autouse=True)
def fresh_plugin_list(monkeypatch):
    monkeypatch.setattr(plugins, "_LOADED", [])


def test_roles_defined_in_a_plugin_file_are_built_in_every_worker(local_ray, tmp_path):
    plugin = tmp_path / "role_plugin.py"
    plugin.write_text(ROLE_PLUGIN)
    spec = plugins.import_plugins([str(plugin)])
    role_cls = sys.modules[plugins.file_module_name(plugin)].PluginRole  # pickled by reference to that module
    pool = ResourcePool(procs_per_node=2, cpus_per_proc=0.5, device="cpu", name="plugin_roles")
    with RayWorkerGroup(pool, role_cls, name="plugin_roles") as group:  # plugins: this process's loaded_plugins()
        answers = group.execute_all("where")
    pids = {pid for pid, _ in answers}
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(loaded == spec for _, loaded in answers)


def test_a_plugin_a_worker_cannot_import_fails_the_group_in_one_line(local_ray, tmp_path):
    missing = tmp_path / "gone_plugin.py"
    pool = ResourcePool(procs_per_node=1, cpus_per_proc=0.5, device="cpu", name="plugin_missing")
    with pytest.raises(WorkerUserError) as info:
        RayWorkerGroup(pool, ProbeWorker, name="plugin_missing", plugins=[str(missing)])
    message = str(info.value)
    assert str(missing) in message and "no such file" in message and "\n" not in message
