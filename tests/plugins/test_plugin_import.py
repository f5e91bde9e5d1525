"""Importing plugins: normalization, once-only import, one-line errors, and the config keys that name them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from one_line_errors import cli_refusal

from rlflow.utils.plugins import PluginError, file_module_name, import_plugins, loaded_plugins


def write_plugin(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return path


def plugin_error(spec: str) -> str:
    with pytest.raises(PluginError) as info:
        import_plugins([spec])
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_relative_file_path_is_made_absolute_and_recorded(tmp_path, monkeypatch):
    plugin = write_plugin(tmp_path / "sub" / "relative_plugin.py", "VALUE = 7\n")
    monkeypatch.chdir(tmp_path)
    assert import_plugins(["sub/relative_plugin.py"]) == [str(plugin)]
    assert str(plugin) in loaded_plugins()
    assert sys.modules[file_module_name(plugin)].VALUE == 7


def test_importing_a_file_twice_runs_it_once(tmp_path):
    counter = tmp_path / "imports.txt"
    plugin = write_plugin(tmp_path / "counted_plugin.py", f"with open({str(counter)!r}, 'a') as f:\n    f.write('x')\n")
    assert import_plugins([str(plugin), str(plugin)]) == [str(plugin)]
    import_plugins([str(tmp_path / "." / "counted_plugin.py")])  # another spelling of the same file
    assert counter.read_text() == "x"
    assert loaded_plugins().count(str(plugin)) == 1


def test_module_name_plugin_is_imported(tmp_path, monkeypatch):
    write_plugin(tmp_path / "user_pkg_for_plugins" / "__init__.py", "")
    write_plugin(tmp_path / "user_pkg_for_plugins" / "registers.py", "REGISTERED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_plugins(["user_pkg_for_plugins.registers"]) == ["user_pkg_for_plugins.registers"]
    assert sys.modules["user_pkg_for_plugins.registers"].REGISTERED


def test_missing_file_names_the_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = plugin_error("nowhere/missing_plugin.py")
    assert str(tmp_path / "nowhere" / "missing_plugin.py") in message and "no such file" in message


def test_missing_module_names_plugin_and_cause():
    message = plugin_error("no_such_pkg_for_rlflow.plugin")
    assert "no_such_pkg_for_rlflow.plugin" in message and "ModuleNotFoundError" in message


def test_exception_inside_the_plugin_names_plugin_and_cause(tmp_path):
    plugin = write_plugin(tmp_path / "broken_plugin.py", "x = 1\nraise RuntimeError('bad\\nthing')\n")
    message = plugin_error(str(plugin))
    assert str(plugin) in message and "RuntimeError: bad thing" in message
    assert file_module_name(plugin) not in sys.modules, "a failed import must not leave a half-built module"


def test_spec_that_is_neither_module_nor_file():
    assert "neither a dotted module name" in plugin_error("my plugin/engine")


def test_command_line_stops_before_ray_with_one_line(tmp_path):
    plugin = write_plugin(tmp_path / "failing_plugin.py", "import this_module_does_not_exist_anywhere\n")
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", f"trainer.plugins=[{plugin}]", f"trainer.ray_temp_dir={tmp_path / 'ray'}"],
                       ray_dir=tmp_path / "ray")  # Ray's session folder never appears: the run stopped before Ray
    assert str(plugin) in line and "ModuleNotFoundError" in line and "this_module_does_not_exist" in line
