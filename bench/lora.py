"""LoRA against full fine-tuning on the GRPO bench's workload: memory, checkpoint size, step and sync time.

Three rlflow runs of ``bench/grpo_vs_trl.py``'s workload (25m preset, fp32, FSDP2 actor colocated with
vLLM, ``trainer.n_procs_per_node`` = cores), one after the other, each ``--steps`` steps and a checkpoint
at the end:

* **full**: full fine-tuning (the baseline);
* **lora merged**: rank-16 adapters on every attention and MLP linear layer, merged weights synced into
  vLLM (``rollout.lora_sync=merged``, the default);
* **lora adapter**: the same adapters synced alone, applied by vLLM at generation (``rollout.lora_sync=adapter``).

Rows: the peak RSS of the largest worker process, the engine checkpoint's bytes on disk, and the median
step, weight-sync and generation times (warm-up step excluded), each against its baseline in the same run.

    python bench/lora.py [--steps 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from grpo_runs import run_rlflow
from grpo_workload import Workload, prepare_inputs
from results import BenchResult, Row, write_result

LORA = ("actor.engine.lora.rank=16", "actor.engine.lora.alpha=32", "actor.engine.optimizer.lr=1e-5")
RUNS = {"full": (), "lora merged": LORA, "lora adapter": (*LORA, "rollout.lora_sync=adapter")}


def _checkpoint_bytes(run_dir: Path) -> int:
    engine_states = [p for p in run_dir.rglob("model_optim") if p.is_dir()]
    return sum(f.stat().st_size for folder in engine_states for f in folder.rglob("*") if f.is_file())


def _median(records: list[dict], key: str) -> float:
    return statistics.median(record[key] for record in records[1:])  # the first step warms up


def measure(steps: int, out: Path) -> dict[str, dict[str, float]]:
    workload = Workload()
    model, data = prepare_inputs(workload, out)
    workers = os.cpu_count() or 1
    measured = {}
    for name, extra in RUNS.items():
        label = name.replace(" ", "_")
        records, rss = run_rlflow(workload, model, data, out, steps, workers, timeout=3600, name=label,
                                  extra=(*extra, "trainer.save_freq=-1"))
        workers_rss = [mb for process, mb in rss.items() if "WorkerHost" in process]
        measured[name] = {"worker_rss_mb": max(workers_rss), "checkpoint_mb": _checkpoint_bytes(out / f"{label}-run") / 2**20,
                          "step_s": _median(records, "step_s"), "weight_sync_s": _median(records, "weight_sync"),
                          "generation_s": _median(records, "generation")}
        print(f"{name}: {measured[name]}", flush=True)
    return measured


def rows(m: dict[str, dict[str, float]]) -> list[Row]:
    full, merged, adapter = m["full"], m["lora merged"], m["lora adapter"]

    def row(name: str, value: float, baseline_name: str, baseline: float, unit: str) -> Row:
        return Row(name, value, baseline_name, baseline, unit, value / baseline, "value / baseline")

    return [
        row("peak RSS of a worker, LoRA (merged sync)", merged["worker_rss_mb"], "full fine-tuning", full["worker_rss_mb"], "MiB"),
        row("engine checkpoint, LoRA", merged["checkpoint_mb"], "full fine-tuning", full["checkpoint_mb"], "MiB"),
        row("step, LoRA (merged sync)", merged["step_s"], "full fine-tuning", full["step_s"], "s"),
        row("weight sync, adapters only", adapter["weight_sync_s"], "merged weights", merged["weight_sync_s"], "s"),
        row("generation, vLLM applying adapters", adapter["generation_s"], "merged weights", merged["generation_s"], "s"),
        row("step, LoRA (adapter sync)", adapter["step_s"], "LoRA (merged sync)", merged["step_s"], "s"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlflow-bench-lora-") as tmp:
        measured = measure(args.steps, Path(tmp))
    result = BenchResult("lora", "LoRA vs full fine-tuning: worker memory, checkpoint size, step and sync time",
                         rows=rows(measured))
    result.notes.append(f"{Workload().describe()}; LoRA: {' '.join(LORA)}; {args.steps} steps, median after the first")
    for row in result.rows:
        print(f"  {row.name}: {row.value:.3g} {row.unit} vs {row.baseline_name} {row.baseline:.3g} ({row.ratio:.2f}x)")
    write_result(args.json, result)


if __name__ == "__main__":
    main()
