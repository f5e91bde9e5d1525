"""``make install``'s choice of torch source on a CPU machine (``scripts/cpu_torch_index.sh``), by pip dry runs.

The pin is read from the Makefile, so the test follows it. A machine with a local wheel of the
pin is simulated by a find-links folder holding a minimal wheel of that exact version (offline:
``PIP_NO_INDEX``); a pin no index serves is a version that does not exist, asked of the machine's
own pip configuration (which must serve some torch: the script refuses to guess otherwise, and so
this test fails with the script's message when no index is reachable).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cpu_torch_index.sh"
CPU_INDEX_OPTION = "--extra-index-url https://download.pytorch.org/whl/cpu"


def makefile_pin() -> str:
    match = re.search(r"^TORCH_CPU := (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert match, "Makefile: no 'TORCH_CPU := torch==...' line"
    return match.group(1)


def choose_index(spec: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), sys.executable, spec], capture_output=True, text=True, timeout=240,
                          env={**os.environ, **env})


def write_wheel(folder: Path, version: str) -> None:
    """A minimal valid ``torch`` wheel of ``version``: what pip reads when it resolves a local file."""
    dist_info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": "",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: rlflow-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist_info}/RECORD"])
    with zipfile.ZipFile(folder / f"torch-{version}-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)


def test_the_pin_is_the_cpu_build() -> None:
    assert makefile_pin().startswith("torch==") and makefile_pin().endswith("+cpu")


def test_a_locally_resolvable_pin_keeps_pips_own_indexes(tmp_path: Path) -> None:
    write_wheel(tmp_path, makefile_pin().removeprefix("torch=="))
    result = choose_index(makefile_pin(), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_an_unresolvable_pin_gets_the_pytorch_cpu_index() -> None:
    result = choose_index("torch==0.0.1+cpu")
    assert result.returncode == 0, f"the script could not tell (is an index reachable?): {result.stderr.strip()}"
    assert result.stdout.strip() == CPU_INDEX_OPTION


def test_no_reachable_index_is_an_error_not_a_guess(tmp_path: Path) -> None:
    result = choose_index(makefile_pin(), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "resolves no version of torch" in result.stderr and "network" in result.stderr
