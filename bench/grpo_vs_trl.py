"""GRPO step time, rlflow against TRL's ``GRPOTrainer``, side by side on the same machine.

    python bench/grpo_vs_trl.py [--json PATH] [--steps 5] [--rounds 2] [--trial-steps 2] [--quick]
    python bench/grpo_vs_trl.py --device cuda --preset 500m --rollout hf --trl-python python3   (a GPU machine)

The workload is issue 16's (``bench/grpo_workload.py``): the random ``25m`` Qwen2, 32 prompts x
8 samples x 64 new tokens, rlflow's addition rule reward, fp32. Both frameworks load the same HF
folder and the same prompts. TRL runs in its own venv with pinned ``trl`` and rlflow's torch
(``bench/trl_venv.py``); rlflow runs through ``main_ppo`` (``bench/grpo_runs.py``).

1. The fp32 matmul peak of the machine: one 1-thread process per core at once, rates summed;
   measured before and after the runs, the larger counts.
2. TRL's best configuration: every one of {1, 2 torch threads} x {gradient checkpointing off,
   on} runs a warm-up step and ``--trial-steps`` timed steps; the smallest median step wins.
3. The comparison, interleaved: ``--rounds`` rounds of (rlflow run, TRL winner run), each a
   warm-up step and ``--steps`` timed steps. Printed per framework: min/median/max step, the
   median of each phase, generated and trained tokens/s, peak RSS per process; then the ratio
   TRL median / rlflow median (target >= 1.5) and rlflow's median / FLOP-limit time (<= 1.4).
4. bf16, only on a CPU with native bf16 (``rlflow.utils.cpu_features``): rlflow and TRL's
   winner at bf16 compute join each round; the row is rlflow bf16 against TRL's best fp32
   (target >= 2.5). Elsewhere one line says why it is skipped.

``--quick``: 4 prompts x 4 samples x 8 new tokens, 1 round, 2 timed steps (a smoke run).

On a GPU (``--device cuda``) both frameworks train there, one rlflow worker per GPU; TRL's trials
are gradient checkpointing off and on (torch threads do not change GPU work); the peak is the
GPU's matmul rate at each dtype; bf16 runs where ``torch.cuda.is_bf16_supported()``.
``--rollout hf`` runs rlflow's HF ``generate`` rollout where vLLM is not installed (TRL then uses
HF ``generate`` too). ``--trl-python`` runs TRL with an existing Python that has ``trl`` and
rlflow's torch, instead of building the venv (a machine with no package index).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import safe_open

from grpo_runs import rlflow_overrides, run_rlflow, run_trl, trl_command, tuned_overrides
from grpo_workload import StepStats, Workload, best_config, format_summary, matmul_params, prepare_inputs, step_flops
from machine import machine_line
from machine_limits import cuda_matmul_peak_gflops, matmul_peak_gflops
from results import BenchResult, Row, write_result
from trl_venv import check_same_torch, ensure_trl_venv, installed_versions

from rlflow.utils.cpu_features import read_cpu_features

REPO = Path(__file__).resolve().parents[1]


def trl_configs(device: str) -> list[tuple[int, bool]]:
    """TRL's configurations to try: (torch threads, gradient checkpointing)."""
    threads = (1, 2) if device == "cpu" else (1,)
    return [(count, gc) for count in threads for gc in (False, True)]


def native_bf16(device: str) -> bool:
    return torch.cuda.is_bf16_supported() if device == "cuda" else read_cpu_features().has_native(torch.bfloat16)


def matmul_peak(device: str, dtype: str) -> tuple[float, str]:
    """The summed matmul rate (GFLOP/s) the FLOP limit divides by, and how it was measured."""
    if device == "cuda":
        rate = cuda_matmul_peak_gflops(dtype)
        return rate, f"{dtype} matmul peak on the GPU: {rate:.1f} GFLOP/s (8192^3, PyTorch's default precision)"
    rates = matmul_peak_gflops()
    return sum(rates), (f"fp32 matmul peak: {sum(rates):.1f} GFLOP/s ({len(rates)} 1-thread processes at once: "
                        f"{', '.join(f'{r:.1f}' for r in rates)})")


def trl_name(threads: int, gradient_checkpointing: bool) -> str:
    return f"{threads} thread{'s' if threads > 1 else ''}, gradient checkpointing {'on' if gradient_checkpointing else 'off'}"


def count_matmul_params(model: Path) -> int:
    with safe_open(str(model / "model.safetensors"), framework="pt") as weights:
        shapes = [(name, weights.get_slice(name).get_shape()) for name in weights.keys()]
    return matmul_params((name, int(torch.Size(shape).numel())) for name, shape in shapes)


def print_rss(label: str, peaks: dict[str, float]) -> None:
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the bench result (bench/results.py) here")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of (rlflow, TRL)")
    parser.add_argument("--trial-steps", type=int, default=2, help="timed steps per TRL configuration trial")
    parser.add_argument("--workers", type=int, default=None, help="rlflow DP ranks (default: cores, or GPUs on cuda)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both frameworks compute")
    parser.add_argument("--preset", default=Workload.preset, help="rlflow model preset (rlflow.models.presets)")
    parser.add_argument("--rollout", default="vllm", choices=["vllm", "hf"], help="rlflow's rollout engine")
    parser.add_argument("--trl-python", default=None, help="run TRL with this Python instead of building the venv")
    parser.add_argument("--quick", action="store_true", help="tiny workload, 1 round, 2 steps: a smoke run")
    parser.add_argument("--out", default="outputs/bench/grpo_vs_trl")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before one run is killed")
    args = parser.parse_args()
    workload = Workload(preset=args.preset, device=args.device)
    if args.workers is None:
        args.workers = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count() or 1
    if args.quick:
        workload = replace(workload, prompts=4, samples=4, new_tokens=8)
        args.steps, args.rounds, args.trial_steps = min(args.steps, 2), 1, 1
    out = (REPO / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()

    print(machine_line())
    print(f"workload: {workload.describe()}")
    python = Path(shutil.which(args.trl_python) or args.trl_python) if args.trl_python else ensure_trl_venv(
        REPO / "outputs" / "bench" / "trl-venv")
    versions = installed_versions(python)
    print(f"TRL python: {python} ({', '.join(f'{name}=={v}' for name, v in versions.items())}), "
          f"torch from {check_same_torch(python)}")
    model, data = prepare_inputs(workload, REPO / "outputs" / "bench" / "grpo_vs_trl")
    params = count_matmul_params(model)
    peak, peak_line = matmul_peak(args.device, workload.dtype)
    print(peak_line)
    overrides = rlflow_overrides(workload, model, data, out / "rlflow-run", 1 + args.steps, args.workers, args.rollout)
    print(f"rlflow: python -m rlflow.trainer.main_ppo {' '.join(overrides)}")

    trials: dict[str, float] = {}
    for threads, gc in trl_configs(args.device):
        try:
            steps, _ = run_trl(python, workload, model, data, out, 1 + args.trial_steps, threads, gc, args.timeout)
        except RuntimeError as error:  # one configuration failing (memory, time limit) leaves the others to choose from
            print(f"TRL trial ({trl_name(threads, gc)}) failed: {error}", flush=True)
            continue
        trials[trl_name(threads, gc)] = StepStats("trial", steps[1:]).median_step
        print(f"TRL trial ({trl_name(threads, gc)}): median step {trials[trl_name(threads, gc)]:.2f} s "
              f"over {len(steps) - 1} steps", flush=True)
    winner = best_config(trials)
    threads, gc = next(config for config in trl_configs(args.device) if trl_name(*config) == winner)
    print(f"TRL best configuration: {winner}")
    print(f"TRL: {' '.join(trl_command(python, workload, model, data, 1 + args.steps, threads, gc))}")

    bf16, processor = native_bf16(args.device), "GPU" if args.device == "cuda" else "CPU"
    bf16_line = (f"bf16: this {processor} has native bf16; rlflow and TRL also run at bf16 compute" if bf16 else
                 f"bf16: skipped, this {processor} has no native bf16 (no AVX-512 bf16 or AMX on a CPU): "
                 "bf16 matmuls run the slow generic path")
    print(bf16_line)
    contenders = {"rlflow": (workload, None), f"TRL ({winner})": (workload, (threads, gc))}
    if bf16:
        half = replace(workload, dtype="bfloat16")
        contenders.update({"rlflow bf16": (half, None), f"TRL bf16 ({winner})": (half, (threads, gc))})
    collected: dict[str, list[dict]] = {name: [] for name in contenders}
    rss: dict[str, dict[str, float]] = {name: {} for name in contenders}
    for round_index in range(args.rounds):
        for name, (load, trl_config) in contenders.items():
            if trl_config is None:
                steps, peaks = run_rlflow(load, model, data, out, 1 + args.steps, args.workers, args.timeout,
                                          rollout=args.rollout)
            else:
                steps, peaks = run_trl(python, load, model, data, out, 1 + args.steps, *trl_config, args.timeout)
            collected[name].extend(steps[1:])
            merge_peaks(rss[name], peaks)
            timed = ", ".join(f"{record['step_s']:.2f}" for record in steps[1:])
            print(f"round {round_index + 1} {name}: steps {timed} s", flush=True)

    stats = {name: StepStats(name, records) for name, records in collected.items()}
    for name, stat in stats.items():
        print(f"{name}: {format_summary(stat.summary())}")
        print_rss(name, rss[name])
    rl, trl = stats["rlflow"], stats[f"TRL ({winner})"]
    speedup = trl.median_step / rl.median_step
    summary = rl.summary()
    flops = step_flops(params, summary["generated_tokens"], summary["trained_tokens"])
    # measured again after the runs: anything else on the machine can only lower a measurement, so the
    # larger one is the peak (a disturbed first measurement once made the limit look 40% easier)
    peak_after, peak_after_line = matmul_peak(args.device, workload.dtype)
    print(f"after the runs: {peak_after_line}")
    if peak_after > peak:
        peak, peak_line = peak_after, peak_after_line
    limit = flops / (peak * 1e9)
    print(f"ratio TRL median / rlflow median: {speedup:.2f} (target >= 1.5)")
    print(f"FLOP limit: {params / 1e6:.2f}M matmul params, {summary['generated_tokens']:.0f} generated + "
          f"{summary['trained_tokens']:.0f} trained tokens -> {flops / 1e12:.3f} TFLOP / {peak:.1f} GFLOP/s = {limit:.2f} s; "
          f"rlflow median / limit = {rl.median_step / limit:.2f} (target <= 1.4)")
    rows = [Row("GRPO step fp32: rlflow", rl.median_step, f"TRL ({winner})", trl.median_step, "s", speedup,
                "baseline / value (speed-up)", ">= 1.5", speedup >= 1.5),
            Row("GRPO step fp32: rlflow vs FLOP limit", rl.median_step, "FLOP-limit time", limit, "s",
                rl.median_step / limit, "value / baseline (x the limit)", "<= 1.4", rl.median_step / limit <= 1.4)]
    if bf16:
        half_ratio = trl.median_step / stats["rlflow bf16"].median_step
        print(f"ratio TRL best fp32 median / rlflow bf16 median: {half_ratio:.2f} (target >= 2.5)")
        rows.append(Row("GRPO step bf16: rlflow", stats["rlflow bf16"].median_step, f"TRL fp32 ({winner})",
                        trl.median_step, "s", half_ratio, "baseline / value (speed-up)", ">= 2.5", half_ratio >= 2.5))
        trl_half = stats[f"TRL bf16 ({winner})"].median_step
        rows.append(Row("GRPO step bf16: rlflow vs TRL at bf16", stats["rlflow bf16"].median_step,
                        f"TRL bf16 ({winner})", trl_half, "s", trl_half / stats["rlflow bf16"].median_step,
                        "baseline / value (speed-up)", "", None))
    print(f"bench wall time: {time.perf_counter() - wall:.0f} s")
    notes = [f"workload: {workload.describe()}; {args.rounds} interleaved rounds x {args.steps} timed steps after a warm-up step",
             f"rlflow: main_ppo, DP={args.workers} colocated (FSDP2 actor + in-process "
             f"{'vLLM' if args.rollout == 'vllm' else 'HF generate'} rollout), 1 torch thread per process; "
             f"settings: {' '.join(tuned_overrides(args.device, args.rollout)) or 'the defaults'}",
             f"TRL {versions['trl']}: GRPOTrainer, HF generate; trials: "
             + "; ".join(f"{name} {s:.2f} s" for name, s in trials.items()) + f"; best: {winner}",
             f"FLOP limit: {params / 1e6:.2f}M matmul params (all but the input embedding); {peak_line}",
             bf16_line]
    title = "GRPO step: rlflow vs TRL GRPOTrainer" + (" on the GPU" if args.device == "cuda" else "")
    write_result(args.json, BenchResult(bench="grpo_vs_trl", title=title, rows=rows,
                                        notes=notes, breakdown={name: stat.breakdown() for name, stat in stats.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
