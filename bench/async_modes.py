"""``async_training.mode=one_step_off`` against sync on the same split placement, with colocated sync beside them.

The same GRPO workload as ``bench/grpo_vs_trl.py`` (``grpo_workload.Workload``: the 25m preset, addition
prompts, fp32, rlflow's tuned settings) runs as three ``main_ppo`` runs, one after the other:

* ``sync, split``: ``trainer.placement=split``, one actor process and one rollout process (``rollout.num_replicas=1``);
* ``one_step_off, split``: the same placement with ``async_training.mode=one_step_off`` (rollout correction
  on, as that mode's default: token TIS, its weights computed in the update's loss);
* ``sync, colocated``: rlflow's default placement, one fused process per core (2 here).

Each contender trains the same number of samples. Wall-clock is the sum of the step times (``timing_s/step``)
after the first ``--warmup`` steps, which compile the actor's layers and vLLM's graphs; the target (issue 43)
is one_step_off at least 1.3x faster than sync on the same split placement.

    python bench/async_modes.py [--steps 8] [--warmup 2] [--preset 25m] [--new-tokens 64] [--out DIR] [--json PATH]

``--preset`` / ``--new-tokens`` change the workload's model and response length (the default is the GRPO bench's).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from grpo_runs import run_rlflow
from grpo_workload import Workload, prepare_inputs
from machine import machine_line
from results import BenchResult, Row, write_result

TARGET = 1.3
SPLIT = ("trainer.placement=split", "rollout.num_replicas=1")
CONTENDERS: dict[str, tuple[int, tuple[str, ...]]] = {  # name -> (trainer processes, extra overrides)
    "sync_split": (1, SPLIT),
    "one_step_off_split": (1, SPLIT + ("async_training.mode=one_step_off",)),
    "sync_colocated": (2, ()),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the wall-clock")
    parser.add_argument("--preset", default=Workload.preset, help="the model preset (rlflow.models.presets)")
    parser.add_argument("--new-tokens", type=int, default=Workload.new_tokens, help="new tokens per response")
    parser.add_argument("--out", default=None, help="work folder (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the result file (bench/results.py) here")
    args = parser.parse_args()
    print(machine_line())
    workload = Workload(preset=args.preset, new_tokens=args.new_tokens)
    out = Path(args.out or tempfile.mkdtemp(prefix="async-bench-"))
    model, data = prepare_inputs(workload, out)
    wall: dict[str, float] = {}
    for name, (workers, extra) in CONTENDERS.items():
        steps, _ = run_rlflow(workload, model, data, out, args.steps, workers, timeout=3600, extra=extra, name=name)
        timed = steps[args.warmup:]
        wall[name] = sum(step["step_s"] for step in timed)
        print(f"{name:<20} {len(timed)} steps {wall[name]:7.1f} s  ({wall[name] / len(timed):.2f} s/step; "
              f"generation wait {sum(step['generation'] for step in timed) / len(timed):.2f} s/step)", flush=True)
    ratio = wall["sync_split"] / wall["one_step_off_split"]
    settings = f"{workload.describe()}; {args.steps} steps, the first {args.warmup} left out"
    print(settings)
    print(f"one_step_off vs sync (split): {ratio:.2f}x (target {TARGET}); colocated sync vs split one_step_off: "
          f"{wall['sync_colocated'] / wall['one_step_off_split']:.2f}x")
    result = BenchResult(bench="async_modes", title="Asynchronous training: one_step_off vs sync", notes=[settings])
    result.rows.append(Row(name="one_step_off, split", value=wall["one_step_off_split"], baseline_name="sync, split",
                           baseline=wall["sync_split"], unit="s", ratio=ratio, ratio_meaning="baseline / value (speed-up)",
                           target=f">= {TARGET}", met=ratio >= TARGET))
    result.rows.append(Row(name="one_step_off, split", value=wall["one_step_off_split"], baseline_name="sync, colocated",
                           baseline=wall["sync_colocated"], unit="s",
                           ratio=wall["sync_colocated"] / wall["one_step_off_split"],
                           ratio_meaning="baseline / value (speed-up)"))
    write_result(args.json, result)


if __name__ == "__main__":
    main()
