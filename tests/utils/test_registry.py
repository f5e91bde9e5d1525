"""The shared ``Registry``: aliases, duplicates and override, metadata, patterns, lazy discovery, one error text."""

from __future__ import annotations

import sys
import textwrap
from enum import Enum
from pathlib import Path

import pytest

from rlflow.engines import EngineConfigError, ENGINE_REGISTRY
from rlflow.errors import UserError
from rlflow.utils.registry import PackageDiscovery, Registry, UnknownNameError


class Shape(str, Enum):
    SQUARE = "square"


def test_name_attribute_sets_the_class_name_to_its_first_registered_name():
    registry: Registry = Registry("shape", base=object, name_attribute="name")

    @registry.register("circle", "round")
    class Circle:
        pass

    assert registry.get("circle") is Circle is registry.get("round") and Circle.name == "circle"
    plain: Registry = Registry("shape")

    @plain.register("square")
    class Square:
        pass

    assert not hasattr(Square, "name")


def test_aliases_share_one_object_and_enums_are_names():
    registry: Registry = Registry("shape", "model.shape")

    @registry.register(Shape.SQUARE, "quad")
    def square():
        return 4

    assert registry.get("square") is square and registry.get("quad") is square and registry.get(Shape.SQUARE) is square
    assert registry.names() == ["quad", "square"] and len(registry) == 2 and list(registry) == ["quad", "square"]
    assert "quad" in registry and Shape.SQUARE in registry and "circle" not in registry and 3 not in registry
    with pytest.raises(ValueError, match="at least one name"):
        registry.register()


def test_duplicate_names_need_override_and_same_object_is_fine():
    registry: Registry = Registry("shape")

    def first():
        return 1

    def second():
        return 2

    registry.register("one")(first)
    registry.register("one")(first)  # the same object again: a module imported twice
    with pytest.raises(ValueError, match=r"shape 'one' is already registered to .*first; pick another name for .*second"):
        registry.register("two", "one")(second)
    assert "two" not in registry  # a refused multi-name registration registers none of its names
    registry.register("one", override=True)(second)
    assert registry.get("one") is second


def test_base_class_is_enforced():
    registry: Registry = Registry("engine", base=Exception)
    registry.register("value")(ValueError)
    with pytest.raises(TypeError, match=r"engine 'number' must be a subclass of Exception; got <class 'int'>"):
        registry.register("number")(int)
    with pytest.raises(TypeError):
        registry.register("instance")(ValueError("not a class"))


def test_metadata_is_per_entry_and_a_copy():
    registry: Registry = Registry("LR schedule")
    registry.register("cosine", "cos", needs_total_steps=True)(lambda p: p)
    registry.register("constant")(lambda p: 1.0)
    assert registry.metadata("cosine") == {"needs_total_steps": True} == registry.metadata("cos")
    assert registry.metadata("constant") == {}
    registry.metadata("cosine")["needs_total_steps"] = False
    assert registry.metadata("cosine") == {"needs_total_steps": True}


def test_patterns_exact_first_then_longest_and_only_when_enabled():
    registry: Registry = Registry("reward data_source", patterns=True)
    registry.register("org/*", scale=1)("broad")
    registry.register("org/math/*")("narrow")
    registry.register("org/math/special")("exact")
    assert registry.get("org/chat") == "broad" and registry.metadata("org/chat") == {"scale": 1}
    assert registry.get("org/math/algebra") == "narrow"
    assert registry.get("org/math/special") == "exact"
    assert "org/anything" in registry and "other/x" not in registry
    plain: Registry = Registry("name")
    plain.register("org/*")("broad")
    assert "org/chat" not in plain
    with pytest.raises(UnknownNameError):
        plain.get("org/chat")


def test_unknown_name_is_one_line_listing_the_registered_names():
    registry: Registry = Registry("policy loss", "actor.policy_loss.loss_mode")
    registry.register("vanilla")(1)
    registry.register("gspo")(2)
    with pytest.raises(UnknownNameError) as info:
        registry.get("ppo2")
    assert str(info.value) == "unknown policy loss 'ppo2' (config key actor.policy_loss.loss_mode); registered: gspo, vanilla"
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)
    with pytest.raises(UnknownNameError):
        registry.metadata("ppo2")
    empty: Registry = Registry("tracker", error=LookupError, hint="add one with @TRACKER_REGISTRY.register")
    with pytest.raises(LookupError) as info:
        empty.get("x")
    assert str(info.value) == "unknown tracker 'x'; registered: (none); add one with @TRACKER_REGISTRY.register"


def test_temporary_rolls_back_registrations():
    registry: Registry = Registry("shape")
    registry.register("kept", tag="a")(1)
    with registry.temporary():
        registry.register("scratch")(2)
        registry.register("kept", override=True)(3)
    assert registry.names() == ["kept"] and registry.get("kept") == 1 and registry.metadata("kept") == {"tag": "a"}


# ------------------------------------------------------------------------------------- discovery
@pytest.fixture
def engine_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A package ``tmp_engines`` on disk, laid out like rlflow/engines: infrastructure, a module and a package engine."""
    root = tmp_path / "tmp_engines"
    files = {
        "__init__.py": "",
        "registry.py": """
            from rlflow.utils.registry import PackageDiscovery, Registry
            REGISTRY = Registry("engine", discovery=PackageDiscovery("tmp_engines", exclude=("registry", "common")))
        """,
        "flat.py": """
            from tmp_engines.registry import REGISTRY
            @REGISTRY.register("flat")
            class Flat: pass
        """,
        "pipelined/__init__.py": """
            from tmp_engines.registry import REGISTRY
            from tmp_engines.pipelined.stages import Stages
            @REGISTRY.register("pipelined", pipeline=True)
            class Pipelined(Stages): pass
        """,
        "pipelined/stages.py": "class Stages: pass\n",
        "common/__init__.py": "raise AssertionError('infrastructure must never be imported by discovery')\n",
        "_private.py": "raise AssertionError('private modules are not engines')\n",
        "silent.py": "",  # a module that registers nothing
        "notes.txt": "not a module\n",
    }
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "tmp_engines"
    for name in [m for m in sys.modules if m == "tmp_engines" or m.startswith("tmp_engines.")]:
        del sys.modules[name]


def test_discovery_lists_modules_and_packages_without_importing_them(engine_package: str):
    assert PackageDiscovery(engine_package, exclude=("registry", "common")).names() == ["flat", "pipelined", "silent"]
    registry = __import__(f"{engine_package}.registry", fromlist=["REGISTRY"]).REGISTRY
    assert registry.names() == ["flat", "pipelined", "silent"]
    assert "pipelined" in registry
    assert not any(m.startswith(f"{engine_package}.pipelined") or m == f"{engine_package}.flat" for m in sys.modules)


def test_discovery_imports_a_package_engine_on_first_lookup(engine_package: str):
    registry = __import__(f"{engine_package}.registry", fromlist=["REGISTRY"]).REGISTRY
    engine = registry.get("pipelined")
    assert engine.__module__ == f"{engine_package}.pipelined" and f"{engine_package}.pipelined.stages" in sys.modules
    assert registry.metadata("pipelined") == {"pipeline": True}
    assert f"{engine_package}.flat" not in sys.modules  # only the name asked for is imported
    assert registry.get("flat").__name__ == "Flat"
    with pytest.raises(UnknownNameError, match="importing engine 'silent' registered nothing under that name"):
        registry.get("silent")
    with pytest.raises(UnknownNameError, match="registered: flat, pipelined, silent"):
        registry.get("common")


def test_temporary_keeps_what_discovery_imported(engine_package: str):
    registry = __import__(f"{engine_package}.registry", fromlist=["REGISTRY"]).REGISTRY
    with registry.temporary():
        registry.get("flat")
        registry.register("scratch")(type("Scratch", (), {}))
    assert registry.get("flat").__name__ == "Flat" and "scratch" not in registry


def test_engine_registry_lists_builtin_engines_but_not_infrastructure():
    names = ENGINE_REGISTRY.names()
    assert {"fsdp", "fsdp2"} <= set(names)
    assert not {"base", "config", "registry", "common"} & set(names)
    assert ENGINE_REGISTRY.get("fsdp2").__module__ == "rlflow.engines.fsdp2"
    with pytest.raises(EngineConfigError, match=r"unknown engine 'nope' \(config key engine.name\); registered: .*fsdp2"):
        ENGINE_REGISTRY.get("nope")
