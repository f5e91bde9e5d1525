"""``.dockerignore`` keeps local state out of the Docker build context and every source file in.

No Docker daemon runs here, so the patterns are checked with Docker's documented matching rules
(``dockerignore_rules.py``, itself checked against the examples of Docker's documentation).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from dockerignore_rules import is_excluded, parse_rules

REPO = Path(__file__).resolve().parents[2]
MUST_STAY_OUT = [
    ".venv", ".venv/bin/python", ".venv/.installed-cpu", ".venv/lib/python3.11/site-packages/torch/__init__.py",
    "outputs", "outputs/demo/sft/hf/model.safetensors",
    ".git", ".git/HEAD", ".git/objects/ab/cdef",
    "rlflow/__pycache__/protocol.cpython-311.pyc", "tests/ppo/__pycache__/conftest.cpython-311-pytest-8.3.4.pyc",
    "rlflow_llm.egg-info/PKG-INFO", "build/lib/rlflow/protocol.py", "dist/rlflow_llm-0.1.0-py3-none-any.whl",
    ".pytest_cache/v/cache/nodeids", ".hypothesis/examples/x", "wandb/offline-run-1/run.wandb",
]
# What the images need even where git is absent (a context copied without .git): make install's inputs.
MUST_STAY_IN = ["setup.py", "Makefile", "scripts/cpu_torch_index.sh", "rlflow/configs/ppo_trainer.yaml",
                "rlflow/protocol.py", "docker/Dockerfile", "recipes/demo.sh", "tests/conftest.py"]


@pytest.fixture(scope="module")
def rules():
    return parse_rules((REPO / ".dockerignore").read_text())


@pytest.mark.parametrize("path", MUST_STAY_OUT)
def test_local_state_stays_out_of_the_context(rules, path: str) -> None:
    assert is_excluded(rules, path)


def test_the_sources_go_in(rules) -> None:
    tracked = []
    if (REPO / ".git").exists():
        tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert [path for path in [*MUST_STAY_IN, *tracked] if is_excluded(rules, path)] == []


@pytest.mark.parametrize("lines,path,excluded", [
    # The examples of Docker's documentation (build context, .dockerignore files).
    (["*/temp*"], "somedir/temporary.txt", True),
    (["*/temp*"], "somedir/temp", True),
    (["*/temp*"], "temp.txt", False),
    (["*/*/temp*"], "somedir/subdir/temporary.txt", True),
    (["*/*/temp*"], "somedir/temporary.txt", False),
    (["temp?"], "tempa", True),
    (["temp?"], "tempab", False),
    (["**/*.go"], "a/b/c.go", True),
    (["**/*.go"], "c.go", True),
    (["*.md", "!README.md"], "README.md", False),
    (["*.md", "!README.md"], "CHANGES.md", True),
    (["*.md", "!README*.md", "README-secret.md"], "README-secret.md", True),
    (["*.md", "README-secret.md", "!README*.md"], "README-secret.md", False),
    (["/foo/bar/"], "foo/bar/baz.txt", True),
    (["foo"], "foo/bar/baz.txt", True),
    (["foo"], "bar/foo", False),
])
def test_the_matcher_follows_dockers_documented_examples(lines: list[str], path: str, excluded: bool) -> None:
    assert is_excluded(parse_rules("\n".join(lines)), path) is excluded
