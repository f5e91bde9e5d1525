"""Each test starts with no plugins recorded, so a Ray worker group that a later test starts in
this process is not handed the temporary plugins these tests import."""

import pytest

from rlflow.utils import plugins


@pytest.fixture(autouse=True)
def fresh_plugin_list(monkeypatch):
    monkeypatch.setattr(plugins, "_LOADED", [])
