"""Soak: memory of a long GRPO run (``make soak``; not in ``make bench``'s list).

    python bench/soak.py [--steps 100] [--workers 2] [--out outputs/soak] [--rollout vllm]

Runs ``python -m rlflow.trainer.main_ppo`` for ``--steps`` GRPO steps on the tiny preset and a
synthetic arithmetic task (vLLM rollout, FSDP2 actor, ``--workers`` Ray worker processes), and
samples the resident set size (RSS) of the driver and of every Ray worker process hosting a
role (``ray::WorkerHost``) every ``--interval`` seconds. Each sample is tagged with the last
step the run has logged (``metrics.jsonl``).

Growth is measured after warm-up: for each process, the median RSS over the samples taken
during the steps just after ``--warmup`` steps against the median over the last 10% of
steps. The acceptance is < 5% growth for every process. It prints a markdown table (machine,
versions, per-process RSS and growth) and writes ``<out>/soak.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from machine import machine_line

REPO = Path(__file__).resolve().parents[1]
WORKER_TITLE = "WorkerHost"
MAX_GROWTH = 0.05


def prepare_inputs(out: Path) -> tuple[Path, Path]:
    """The tiny preset and the demo's task files under ``out`` (built once, reused after)."""
    from rlflow.data.tasks import build_task, write_task_files
    from rlflow.data.tasks.corpus import tokenizer_corpus
    from rlflow.models.presets import build_preset

    model = build_preset(out / "model", tokenizer_corpus(), preset="tiny", seed=0)
    data = out / "data"
    if not (data / "train.parquet").is_file():
        write_task_files(build_task("chain_arith", digits=1, num_ops=3), data, n_train=2048, n_val=64, seed=0)
    return model, data


def run_command(args: argparse.Namespace, model: Path, data: Path, run_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "rlflow.trainer.main_ppo",
        "algorithm=grpo", "actor.engine=fsdp2", f"rollout={args.rollout}",
        "model=hf", f"model.path={model}",
        f"data.train_files=[{data / 'train.parquet'}]", f"data.val_files=[{data / 'val.parquet'}]",
        "data.max_response_length=32", "data.train_batch_size=16", "rollout.n=4",
        "actor.ppo_mini_batch_size=16", "actor.engine.micro_batch_size=64", "actor.engine.optimizer.lr=1e-4",
        f"trainer.n_procs_per_node={args.workers}", f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=25", "trainer.save_freq=25", "trainer.max_ckpt_to_keep=1", "trainer.resume_mode=disable",
        "trainer.logger=[console,jsonl]", f"trainer.default_local_dir={run_dir}",
    ]


def last_logged_step(jsonl: Path) -> int:
    if not jsonl.is_file():
        return 0
    lines = [line for line in jsonl.read_text().splitlines() if line.strip()]
    return int(json.loads(lines[-1]).get("training/global_step", 0)) if lines else 0


def role_processes(driver: psutil.Process) -> dict[str, psutil.Process]:
    """The driver and the Ray worker processes that host roles, by label."""
    found = {"driver": driver}
    for child in driver.children(recursive=True):
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if WORKER_TITLE in title:
            found[f"worker_{child.pid}"] = child
    return found


class RSSSampler(threading.Thread):
    """Samples the RSS of the driver and its role workers until stopped."""

    def __init__(self, driver_pid: int, jsonl: Path, interval: float):
        super().__init__(daemon=True)
        self.driver, self.jsonl, self.interval = psutil.Process(driver_pid), jsonl, interval
        self.samples: list[dict] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            step = last_logged_step(self.jsonl)
            try:
                processes = role_processes(self.driver)
            except psutil.Error:
                return
            for label, process in processes.items():
                try:
                    self.samples.append({"step": step, "process": label, "rss_mb": process.memory_info().rss / 2**20})
                except psutil.Error:
                    continue


def growth_table(samples: list[dict], warmup: int, steps: int) -> list[dict]:
    """Per process: median RSS just after warm-up, over the last 10% of steps, and the growth."""
    tail_start = steps - max(1, steps // 10)
    rows = []
    for label in sorted({s["process"] for s in samples}):
        mine = [s for s in samples if s["process"] == label]
        early = [s["rss_mb"] for s in mine if warmup <= s["step"] < warmup + max(1, steps // 10)]
        late = [s["rss_mb"] for s in mine if s["step"] >= tail_start]
        if not early or not late:
            continue
        base, end = statistics.median(early), statistics.median(late)
        rows.append({"process": "driver" if label == "driver" else "worker", "pid_label": label,
                     "rss_after_warmup_mb": round(base, 1), "rss_end_mb": round(end, 1),
                     "peak_mb": round(max(s["rss_mb"] for s in mine), 1), "growth": round(end / base - 1, 4)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10, help="steps before the baseline is taken")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rollout", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between RSS samples")
    parser.add_argument("--out", default="outputs/soak")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    model, data = prepare_inputs(out)
    run_dir = out / "run"
    jsonl = run_dir / "metrics.jsonl"
    if jsonl.exists():
        jsonl.unlink()  # a fresh run: the step tags must come from this one
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(out / "run.log", "w") as log:
        process = subprocess.Popen(run_command(args, model, data, run_dir), cwd=REPO, env=env, stdout=log, stderr=log)
        sampler = RSSSampler(process.pid, jsonl, args.interval)
        sampler.start()
        code = process.wait()
        sampler.stop.set()
        sampler.join()
    if code != 0:
        print(f"main_ppo exited {code}; see {out / 'run.log'}", file=sys.stderr)
        return code
    rows = growth_table(sampler.samples, args.warmup, args.steps)
    result = {"machine": machine_line(), "steps": args.steps, "warmup": args.warmup, "workers": args.workers,
              "wall_s": round(time.perf_counter() - start, 1), "rows": rows, "max_growth": MAX_GROWTH,
              "passed": bool(rows) and all(row["growth"] < MAX_GROWTH for row in rows)}
    (out / "soak.json").write_text(json.dumps({**result, "samples": sampler.samples}, indent=1))
    print(f"soak: {args.steps} GRPO steps, {args.workers} workers, {result['wall_s']} s; {result['machine']}")
    print("| process | RSS after warm-up (MiB) | RSS at the end (MiB) | peak (MiB) | growth |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['process']} | {row['rss_after_warmup_mb']} | {row['rss_end_mb']} | {row['peak_mb']} | "
              f"{row['growth']:+.1%} |")
    print("PASS" if result["passed"] else f"FAIL: growth >= {MAX_GROWTH:.0%} (or no samples)")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
