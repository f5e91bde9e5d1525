"""GRPO step time, rlflow against TRL's ``GRPOTrainer``, side by side on the same machine.

    python bench/grpo_vs_trl.py [--json PATH] [--steps 5] [--rounds 2] [--trial-steps 3] [--dtypes fp32 bf16] [--quick]
    python bench/grpo_vs_trl.py --device cuda --preset 500m --rollout hf --trl-python python3   (a GPU machine)

The workload is issue 16's (``bench/grpo_workload.py``): the random ``25m`` Qwen2, 32 prompts x
8 samples x 64 new tokens, rlflow's addition rule reward, fp32. Both frameworks load the same HF
folder and the same parquet rows.

* TRL runs in its own venv, a plain ``pip install trl==1.16.0`` with the torch and transformers
  pip picks for it, nothing of rlflow's on its path (``bench/trl_venv.py``); its runner never
  imports rlflow. rlflow runs through ``main_ppo`` in its own venv (``bench/grpo_runs.py``). Both
  sides' torch, transformers and other versions are printed, transformers on one line.
* Same task: TRL's reward is rlflow's rule itself (``score_final_answer``, loaded by path; the bench
  checks that rlflow's reward for the data still runs it). Both turn a row's chat messages into
  prompt tokens with the tokenizer's chat template (rlflow's data loader has no raw-text option);
  the bench checks that the first prompt TRL tokenises has the same ids in rlflow's loader and
  prints both token counts.

1. The fp32 matmul peak of the machine: one 1-thread process per core at once, rates summed;
   measured before and after the runs, the larger counts.
2. TRL's best configuration: every one of {1, 2 torch threads} x {gradient checkpointing off, on}
   x {the batch in 1 micro-batch, in 4 (gradient accumulation)} runs a warm-up step and
   ``--trial-steps`` timed steps (at least 3 outside ``--quick``); each step generates all 256
   completions at once and trains all of them, whatever the split. The smallest median wins; a
   trial that fails is reported and left out. Every trial's median is printed and goes into the
   notes.
3. The comparison, interleaved: ``--rounds`` rounds in which each contender runs once (a warm-up
   step and ``--steps`` timed steps): "rlflow defaults" (the workload's overrides only), "rlflow
   best" (plus ``grpo_runs.tuned_overrides``) and "TRL best". Printed per contender: min/median/max
   step, the median of each phase, generated and trained tokens/s, peak RSS per process. Rows:
   rlflow defaults against TRL best (TRL median / rlflow median, target >= 1.5), rlflow best
   against TRL best, and rlflow best's median / the FLOP-limit time (target <= 1.4).
4. bf16, only where the hardware has native bf16 (``rlflow.utils.cpu_features`` on a CPU): TRL's
   search runs again at bf16, and the three contenders at bf16 join each round; rows: rlflow
   defaults bf16 against TRL best bf16 (target >= 1.5), rlflow best bf16 against TRL best bf16.
   Elsewhere one line says why bf16 is skipped.

``--quick``: 4 prompts x 4 samples x 8 new tokens, 1 round, 2 timed steps, 1 timed trial step (a
smoke run). ``--dtypes bf16`` (or ``fp32``) runs one dtype's search, contenders and rows only: the fp32
search alone takes about an hour on 2 cores.

On a GPU (``--device cuda``) both frameworks train there, one rlflow worker per GPU; TRL's trials
leave torch threads at 1 (they do not change GPU work); the peak is the GPU's matmul rate at each
dtype; bf16 runs where ``torch.cuda.is_bf16_supported()``. ``--rollout hf`` runs rlflow's HF
``generate`` rollout where vLLM is not installed (TRL uses HF ``generate`` either way).
``--trl-python`` runs TRL with an existing Python that has ``trl`` instead of building the venv
(a machine with no package index).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch
from safetensors import safe_open

from grpo_runs import (TrlConfig, check_reward_rule, rlflow_overrides, run_rlflow, run_trl, same_prompt_line,
                       trl_command, trl_log, tuned_overrides)
from grpo_workload import StepStats, Workload, best_config, format_summary, matmul_params, prepare_inputs, step_flops
from machine import machine_line
from machine_limits import cuda_matmul_peak_gflops, matmul_peak_gflops
from results import BenchResult, Row, write_result
from trl_venv import RLFLOW_PACKAGES, TRL_PACKAGES, TRL_PIN, ensure_trl_venv, format_versions, installed_versions

from rlflow.utils.cpu_features import read_cpu_features

REPO = Path(__file__).resolve().parents[1]
ACCUMULATION = (1, 4)  # micro-batches per step TRL tries: the whole batch at once, or a quarter at a time
# one timed run of a contender: (per-step records, peak RSS MiB per process)
Run = Callable[[], tuple[list[dict], dict[str, float]]]


def trl_configs(device: str, sequences: int) -> list[TrlConfig]:
    """TRL's configurations to try: threads x gradient checkpointing x micro-batches that split the batch evenly."""
    threads = (1, 2) if device == "cpu" else (1,)
    return [TrlConfig(count, gc, split) for count in threads for gc in (False, True)
            for split in ACCUMULATION if sequences % split == 0]


def native_bf16(device: str) -> bool:
    """Whether the GPU, or the CPU's instruction set, computes bf16 natively."""
    return torch.cuda.is_bf16_supported() if device == "cuda" else read_cpu_features().has_native(torch.bfloat16)


def dtype_tag(workload: Workload) -> str:
    """``fp32`` or ``bf16``: how rows and contender names call the workload's dtype."""
    return "fp32" if workload.dtype == "float32" else "bf16"


def matmul_peak(device: str, dtype: str) -> tuple[float, str]:
    """The summed matmul rate (GFLOP/s) the FLOP limit divides by, and how it was measured."""
    if device == "cuda":
        rate = cuda_matmul_peak_gflops(dtype)
        return rate, f"{dtype} matmul peak on the GPU: {rate:.1f} GFLOP/s (8192^3, PyTorch's default precision)"
    rates = matmul_peak_gflops()
    return sum(rates), (f"fp32 matmul peak: {sum(rates):.1f} GFLOP/s ({len(rates)} 1-thread processes at once: "
                        f"{', '.join(f'{r:.1f}' for r in rates)})")


def count_matmul_params(model: Path) -> int:
    """Parameters of the HF folder's weights that take part in a matmul (``grpo_workload.matmul_params``)."""
    with safe_open(str(model / "model.safetensors"), framework="pt") as weights:
        shapes = [(name, weights.get_slice(name).get_shape()) for name in weights.keys()]
    return matmul_params((name, int(torch.Size(shape).numel())) for name, shape in shapes)


def print_rss(label: str, peaks: dict[str, float]) -> None:
    """One line of the contender's peak RSS per process (those of 50 MiB or more)."""
    shown = ", ".join(f"{name} {mb:.0f}" for name, mb in peaks.items() if mb >= 50)
    print(f"  peak RSS MiB ({label}): {shown}")


def merge_peaks(into: dict[str, float], peaks: dict[str, float]) -> None:
    """Across runs (pids differ): the i-th process of each kind (by pid) is ``kind#i``; the largest peak of each."""
    by_kind: dict[str, list[tuple[int, float]]] = {}
    for name, mb in peaks.items():
        kind, _, pid = name.rpartition(":")
        by_kind.setdefault(kind or name, []).append((int(pid) if pid.isdigit() else 0, mb))
    for kind, found in by_kind.items():
        for index, (_, mb) in enumerate(sorted(found)):
            label = kind if len(found) == 1 else f"{kind}#{index}"
            into[label] = max(mb, into.get(label, 0.0))


def print_versions(trl_python: Path) -> str:
    """Print both sides' library versions (transformers and torch side by side on one line); the notes' line."""
    ours = installed_versions(Path(sys.executable), RLFLOW_PACKAGES)
    theirs = installed_versions(trl_python, TRL_PACKAGES)
    print(f"rlflow side ({sys.executable}): {format_versions(ours)}")
    print(f"TRL side ({trl_python}): {format_versions(theirs)}")
    line = "; ".join(f"{name}: rlflow {ours[name]}, TRL {theirs[name]}" for name in ("transformers", "torch"))
    print(line)
    return f"versions: rlflow side {format_versions(ours)}; TRL side {format_versions(theirs)}"


def search_trl(python: Path, workload: Workload, model: Path, data: Path, out: Path, steps: int,
               timeout: float) -> tuple[TrlConfig, dict[str, Optional[float]]]:
    """TRL's fastest configuration at ``workload.dtype`` (each a warm-up step and ``steps`` timed steps, the
    smallest median wins) and every trial's median step (None: the trial failed and is left out)."""
    configs, trials = trl_configs(workload.device, workload.sequences), {}
    for config in configs:
        label = f"TRL trial {dtype_tag(workload)} ({config.name})"
        try:
            records, _ = run_trl(python, workload, model, data, out, 1 + steps, config, timeout)
        except RuntimeError as error:  # one configuration failing (memory, time limit) leaves the others to choose from
            print(f"{label} failed: {error}", flush=True)
            trials[config.name] = None
            continue
        trials[config.name] = StepStats("trial", records[1:]).median_step
        print(f"{label}: median step {trials[config.name]:.2f} s over {len(records) - 1} steps", flush=True)
    winner = best_config({name: median for name, median in trials.items() if median is not None})
    return next(config for config in configs if config.name == winner), trials


def trials_note(tag: str, trials: dict[str, Optional[float]], best: TrlConfig) -> str:
    """``fp32: <config> 12.34 s; <config> failed; ...; best fp32: <config>``."""
    listed = "; ".join(f"{name} {'failed' if median is None else f'{median:.2f} s'}" for name, median in trials.items())
    return f"{tag}: {listed}; best {tag}: {best.name}"


def contenders_at(load: Workload, best: TrlConfig, python: Path, model: Path, data: Path, out: Path,
                  args: argparse.Namespace) -> dict[str, Run]:
    """The three contenders at ``load.dtype``: rlflow at its defaults, rlflow with its tuned settings, TRL's best."""
    tag = dtype_tag(load)
    rlflow = partial(run_rlflow, load, model, data, out, 1 + args.steps, args.workers, args.timeout,
                     rollout=args.rollout)
    return {f"rlflow defaults {tag}": partial(rlflow, name=f"rlflow-defaults-{tag}", tuned=False),
            f"rlflow best {tag}": partial(rlflow, name=f"rlflow-best-{tag}"),
            f"TRL best {tag}": partial(run_trl, python, load, model, data, out, 1 + args.steps, best, args.timeout)}


def run_rounds(contenders: dict[str, Run], rounds: int) -> tuple[dict[str, StepStats], dict[str, dict[str, float]]]:
    """``rounds`` rounds, each running every contender once in turn; each one's timed steps and peak RSS."""
    collected: dict[str, list[dict]] = {name: [] for name in contenders}
    rss: dict[str, dict[str, float]] = {name: {} for name in contenders}
    for round_index in range(rounds):
        for name, run in contenders.items():
            steps, peaks = run()
            collected[name].extend(steps[1:])
            merge_peaks(rss[name], peaks)
            timed = ", ".join(f"{record['step_s']:.2f}" for record in steps[1:])
            print(f"round {round_index + 1} {name}: steps {timed} s", flush=True)
    return {name: StepStats(name, records) for name, records in collected.items()}, rss


def speedup_row(tag: str, rlflow: str, stats: dict[str, StepStats], best: TrlConfig, target: Optional[float]) -> Row:
    """``rlflow <rlflow> <tag>`` against ``TRL best <tag>`` (TRL median / rlflow median), printed too."""
    ours, theirs = stats[f"rlflow {rlflow} {tag}"].median_step, stats[f"TRL best {tag}"].median_step
    ratio = theirs / ours
    print(f"ratio TRL best {tag} median / rlflow {rlflow} {tag} median: {ratio:.2f}"
          + (f" (target >= {target})" if target else ""))
    return Row(f"GRPO step {tag}: rlflow {rlflow}", ours, f"TRL best {tag} ({best.name})", theirs, "s", ratio,
               "baseline / value (speed-up)", f">= {target}" if target else "", ratio >= target if target else None)


def flop_limit_row(rlflow: StepStats, params: int, peak: float) -> Row:
    """rlflow best fp32's median step against the FLOP-limit time of its tokens at ``peak`` GFLOP/s, printed too."""
    summary = rlflow.summary()
    flops = step_flops(params, summary["generated_tokens"], summary["trained_tokens"])
    limit = flops / (peak * 1e9)
    print(f"FLOP limit: {params / 1e6:.2f}M matmul params, {summary['generated_tokens']:.0f} generated + "
          f"{summary['trained_tokens']:.0f} trained tokens -> {flops / 1e12:.3f} TFLOP / {peak:.1f} GFLOP/s = "
          f"{limit:.2f} s; rlflow best median / limit = {rlflow.median_step / limit:.2f} (target <= 1.4)")
    times = rlflow.median_step / limit
    return Row("GRPO step fp32: rlflow best vs FLOP limit", rlflow.median_step, "FLOP-limit time", limit, "s",
               times, "value / baseline (x the limit)", "<= 1.4", times <= 1.4)


def parse_args() -> argparse.Namespace:
    """The command line; ``--quick`` shrinks the run, ``--workers`` defaults to the cores (GPUs on cuda)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the bench result (bench/results.py) here")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every contender")
    parser.add_argument("--trial-steps", type=int, default=3, help="timed steps per TRL configuration trial (>= 3)")
    parser.add_argument("--workers", type=int, default=None, help="rlflow DP ranks (default: cores, or GPUs on cuda)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both frameworks compute")
    parser.add_argument("--preset", default=Workload.preset, help="rlflow model preset (rlflow.models.presets)")
    parser.add_argument("--rollout", default="vllm", choices=["vllm", "hf"], help="rlflow's rollout engine")
    parser.add_argument("--trl-python", default=None, help="run TRL with this Python instead of building the venv")
    parser.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                        help="the dtypes to compare (bf16 only where the hardware has native bf16)")
    parser.add_argument("--quick", action="store_true", help="tiny workload, 1 round, 2 steps: a smoke run")
    parser.add_argument("--out", default="outputs/bench/grpo_vs_trl")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before one run is killed")
    args = parser.parse_args()
    if args.workers is None:
        args.workers = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count() or 1
    if args.quick:
        args.steps, args.rounds, args.trial_steps = min(args.steps, 2), 1, 1
    elif args.trial_steps < 3:
        parser.error("--trial-steps must be at least 3 (a median of fewer steps picks TRL's configuration by noise)")
    return args


def bf16_line(device: str) -> str:
    """Whether bf16 runs on ``device``, and why not where it does not."""
    processor = "GPU" if device == "cuda" else "CPU"
    if native_bf16(device):
        return f"bf16: this {processor} has native bf16; TRL's search and every contender also run at bf16 compute"
    return (f"bf16: skipped, this {processor} has no native bf16 (no AVX-512 bf16 or AMX on a CPU): "
            "bf16 matmuls run the slow generic path")


def print_rlflow_settings(workload: Workload, model: Path, data: Path, out: Path, args: argparse.Namespace) -> str:
    """Print rlflow's command at its defaults and what "rlflow best" adds; the notes' line."""
    defaults = rlflow_overrides(workload, model, data, out / "rlflow-defaults-fp32-run", 1 + args.steps, args.workers,
                                args.rollout, tuned=False)
    tuned = " ".join(tuned_overrides(args.device, args.rollout)) or "nothing"
    print(f"rlflow defaults: python -m rlflow.trainer.main_ppo {' '.join(defaults)}")
    print(f"rlflow best adds: {tuned}")
    return (f"rlflow: main_ppo, DP={args.workers} colocated (FSDP2 actor + in-process "
            f"{'vLLM' if args.rollout == 'vllm' else 'HF generate'} rollout), 1 torch thread per process; "
            f"defaults: the workload's overrides only; best adds: {tuned}")


def prepare_contenders(python: Path, loads: list[Workload], model: Path, data: Path, out: Path,
                       args: argparse.Namespace) -> tuple[dict[str, TrlConfig], dict[str, Run], str]:
    """TRL's search at each dtype (printed), then the contenders of the rounds; TRL's best per dtype, the
    contenders, and the notes' line listing every trial."""
    best, contenders, listed = {}, {}, []
    for load in loads:
        best[load.dtype], trials = search_trl(python, load, model, data, out, args.trial_steps, args.timeout)
        listed.append(trials_note(dtype_tag(load), trials, best[load.dtype]))
        print(f"TRL best {dtype_tag(load)}: {best[load.dtype].name}")
        print(f"TRL: {' '.join(trl_command(python, load, model, data, 1 + args.steps, best[load.dtype]))}")
        contenders.update(contenders_at(load, best[load.dtype], python, model, data, out, args))
    where = args.trl_python or f"its own venv (pip install {TRL_PIN})"
    return best, contenders, (f"TRL: GRPOTrainer, HF generate, in {where}; every TRL trial listed (median of "
                              f"{args.trial_steps} timed steps after a warm-up step): " + "; ".join(listed))


def comparison_rows(stats: dict[str, StepStats], best: dict[str, TrlConfig], params: int, peak: float) -> list[Row]:
    """The result's rows, printed: each rlflow contender against TRL's best at its dtype, rlflow best fp32
    against the FLOP limit."""
    rows = []
    if "float32" in best:
        rows += [speedup_row("fp32", "defaults", stats, best["float32"], 1.5),
                 speedup_row("fp32", "best", stats, best["float32"], None),
                 flop_limit_row(stats["rlflow best fp32"], params, peak)]
    if "bfloat16" in best:
        rows += [speedup_row("bf16", "defaults", stats, best["bfloat16"], 1.5),
                 speedup_row("bf16", "best", stats, best["bfloat16"], None)]
    return rows


def main() -> int:
    args = parse_args()
    workload = Workload(preset=args.preset, device=args.device)
    if args.quick:
        workload = replace(workload, prompts=4, samples=4, new_tokens=8)
    loads = [replace(workload, dtype={"fp32": "float32", "bf16": "bfloat16"}[tag]) for tag in dict.fromkeys(args.dtypes)
             if tag == "fp32" or native_bf16(args.device)]
    if not loads:
        print("error: --dtypes bf16 on hardware without native bf16 leaves nothing to compare", file=sys.stderr)
        return 2
    out = (REPO / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()

    print(machine_line())
    print(f"workload: {workload.describe()}")
    python = Path(shutil.which(args.trl_python) or args.trl_python) if args.trl_python else ensure_trl_venv(
        REPO / "outputs" / "bench" / "trl-venv")
    versions_line = print_versions(python)
    model, data = prepare_inputs(workload, REPO / "outputs" / "bench" / "grpo_vs_trl")
    check_reward_rule(data)
    params = count_matmul_params(model)
    peak, peak_line = matmul_peak(args.device, workload.dtype)
    print(peak_line)
    rlflow_line = print_rlflow_settings(workload, model, data, out, args)
    print(bf16_line(args.device))
    best, contenders, trials_line = prepare_contenders(python, loads, model, data, out, args)
    prompt_line = same_prompt_line(model, data, trl_log(out, loads[0], best[loads[0].dtype]))
    print(prompt_line)

    stats, rss = run_rounds(contenders, args.rounds)
    for name, stat in stats.items():
        print(f"{name}: {format_summary(stat.summary())}")
        print_rss(name, rss[name])
    # measured again after the runs: anything else on the machine can only lower a measurement, so the
    # larger one is the peak (a disturbed first measurement once made the limit look 40% easier)
    peak_after, peak_after_line = matmul_peak(args.device, workload.dtype)
    print(f"after the runs: {peak_after_line}")
    if peak_after > peak:
        peak, peak_line = peak_after, peak_after_line
    rows = comparison_rows(stats, best, params, peak)
    print(f"bench wall time: {time.perf_counter() - wall:.0f} s")
    notes = [f"workload: {workload.describe()}; {args.rounds} interleaved rounds x {args.steps} timed steps after a "
             "warm-up step", versions_line, rlflow_line, trials_line,
             f"reward: rlflow's score_final_answer on both sides; {prompt_line}",
             f"FLOP limit: {params / 1e6:.2f}M matmul params (all but the input embedding); {peak_line}",
             bf16_line(args.device)]
    title = "GRPO step: rlflow vs TRL GRPOTrainer" + (" on the GPU" if args.device == "cuda" else "")
    breakdown = {name: stat.breakdown() for name, stat in stats.items()}
    write_result(args.json, BenchResult(bench="grpo_vs_trl", title=title, rows=rows, notes=notes, breakdown=breakdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
