"""Profile one GRPO actor update (one rank's share) in this process with ``torch.profiler``.

    python bench/profile_update.py [--model DIR | --preset 25m] [--device cpu|cuda] [--rows 128] [--prompt-len 20]
        [--response-len 64] [--mean-response 64] [--micro-batch-size 4] [--samples 1] [--set KEY=VALUE ...] [--timed N]
        [--trace out.json] [--by-shape]

The update is exactly what the PPO driver runs on one rank: ``Actor.forward_backward`` logic
(on-policy, old log-probs from the update's forward, entropy on) through the configured engine,
then ``optim_step``. The batch is rollout-shaped: left-padded prompts (each shared by ``--samples``
consecutive rows, GRPO's ``n``), responses whose lengths are drawn around ``--mean-response``
(right padding up to ``--response-len``). One warm-up
update runs first; the profiled one prints the top operators by self CPU time, the share of
forward / backward / optimizer, and how many of the trained positions were padding.
``--set`` passes extra ``actor.engine.*``/``actor.*`` overrides (e.g. ``actor.engine.use_dynamic_bsz=true``).
``--timed N`` then times N more updates without the profiler and prints their median and range (to
compare settings, run it once per setting, taking turns). On ``--device cuda`` the profiler records
the GPU's kernels too, sorted by their GPU time, and each timed update ends with a synchronize.
On a CPU the process keeps freed memory in its heap, as rlflow's CPU workers do (``rlflow.utils.cpu_heap``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from transformers import AutoConfig

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.engines.registry import build_engine
from rlflow.models.presets import build_preset
from rlflow.protocol import DataProto
from rlflow.roles.batch_views import engine_batch
from rlflow.roles.losses import OLD_LOG_PROBS_FROM_UPDATE, make_policy_loss_fn
from rlflow.trainer.entry_points import compose_ppo_config
from rlflow.utils.cpu_heap import retain_freed_memory
from rlflow.utils.device import limit_cpu_threads

from machine import machine_line


def rollout_batch(rows: int, prompt_len: int, response_len: int, mean_response: int, vocab: int,
                  samples: int = 1) -> DataProto:
    """Left-padded prompts (lengths prompt_len/2..prompt_len), each shared by ``samples`` consecutive rows as in
    GRPO, and right-padded responses around ``mean_response``."""
    gen = torch.Generator().manual_seed(0)
    group_first = torch.arange(rows) // samples * samples
    prompt_lens = torch.randint(prompt_len // 2, prompt_len + 1, (rows,), generator=gen)[group_first]
    spread = max(1, mean_response // 2)
    resp_lens = (torch.randint(-spread, spread + 1, (rows,), generator=gen) + mean_response).clamp(1, response_len)
    width = prompt_len + response_len
    input_ids = torch.randint(0, vocab, (rows, width), generator=gen)
    input_ids[:, :prompt_len] = input_ids[group_first, :prompt_len]
    positions = torch.arange(width).expand(rows, width)
    prompt_mask = positions >= (prompt_len - prompt_lens)[:, None]
    response_mask = torch.arange(response_len).expand(rows, response_len) < resp_lens[:, None]
    attention_mask = torch.cat([prompt_mask[:, :prompt_len], response_mask], dim=1).long()
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
         "responses": input_ids[:, prompt_len:].clone(), "response_mask": response_mask.long(),
         "advantages": torch.randn(rows, response_len, generator=gen) * response_mask},
        meta_info={"temperature": 1.0},
    )


def update(engine: Any, loss_fn: Any, data: DataProto) -> dict[str, float]:
    """``Actor.forward_backward`` (on-policy path) followed by ``optim_step``."""
    view = engine_batch(data, extra_keys=("advantages",))
    view.meta_info = {"temperature": 1.0, "compute_entropy": True, OLD_LOG_PROBS_FROM_UPDATE.name: True}
    with engine.train_mode():
        with record_function("phase/forward_backward"):
            _, metrics = engine.forward_backward(view, loss_fn)
        with record_function("phase/optim_step"):
            metrics.update(engine.optim_step())
    return metrics


def timed_update(engine: Any, loss_fn: Any, data: DataProto, device: str) -> float:
    """Seconds of one update, the device's queued work included."""
    start = time.perf_counter()
    update(engine, loss_fn, data)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: build --preset)")
    parser.add_argument("--preset", default="25m", help="preset built when --model is not given")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rows", type=int, default=128, help="sequences on this rank (256 / DP=2)")
    parser.add_argument("--prompt-len", type=int, default=20)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--mean-response", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1, help="consecutive rows sharing a prompt (GRPO's n)")
    parser.add_argument("--set", nargs="*", default=[], help="extra Hydra overrides of the ppo config")
    parser.add_argument("--trace", type=Path, default=None, help="write a Chrome trace here")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--timed", type=int, default=0, help="then time this many updates without the profiler")
    parser.add_argument("--by-shape", action="store_true", help="also print the top operators grouped by input shapes")
    args = parser.parse_args()
    print(machine_line())
    limit_cpu_threads(1)
    if args.device == "cpu":
        retain_freed_memory()
    model = args.model or build_preset(Path(tempfile.mkdtemp(prefix="prof")) / args.preset, tokenizer_corpus(),
                                       preset=args.preset, seed=0)
    config = compose_ppo_config([f"model.path={model}", "model.preset=null", "rollout=hf", "actor.engine=fsdp2",
                                 f"actor.engine.device={args.device}", f"trainer.device={args.device}",
                                 f"actor.ppo_mini_batch_size={args.rows}",
                                 f"actor.engine.micro_batch_size={args.micro_batch_size}", *args.set])
    engine = build_engine(config.actor.engine, str(model))
    engine.initialize()
    loss_fn = make_policy_loss_fn(config.actor)
    data = rollout_batch(args.rows, args.prompt_len, args.response_len, args.mean_response,
                         AutoConfig.from_pretrained(model).vocab_size, args.samples)
    real = int(data.batch["attention_mask"].sum())
    print(f"batch: {args.rows} rows x {data.batch['input_ids'].shape[1]} positions, {real} real tokens "
          f"({1 - real / data.batch['attention_mask'].numel():.1%} padding), response tokens "
          f"{int(data.batch['response_mask'].sum())}; overrides {args.set}")
    timed_update(engine, loss_fn, data, args.device)  # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    sort_by = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
    start = time.perf_counter()
    with profile(activities=activities, record_shapes=args.by_shape) as prof:
        metrics = update(engine, loss_fn, data)
    seconds = time.perf_counter() - start
    print(f"profiled update: {seconds:.2f} s (with profiler), grad_norm {metrics.get('grad_norm')}")
    if args.by_shape:
        print(prof.key_averages(group_by_input_shape=True).table(sort_by=sort_by, row_limit=args.top))
    averages = prof.key_averages()
    total = sum(event.self_cpu_time_total for event in averages)
    phases: dict[str, float] = {}  # on cuda a phase is listed twice: its CPU range and its (CPU-time-less) GPU range
    for event in averages:
        if event.key.startswith("phase/"):
            phases[event.key] = max(phases.get(event.key, 0.0), event.cpu_time_total)
    for key, value in sorted(phases.items()):
        print(f"  {key:32s} {value / 1e6:7.2f} s  {value / total:6.1%}")
    print(averages.table(sort_by=sort_by, row_limit=args.top))
    if args.trace:
        prof.export_chrome_trace(str(args.trace))
        print(f"chrome trace: {args.trace}")
    if args.timed:
        times = [timed_update(engine, loss_fn, data, args.device) for _ in range(args.timed)]
        print(f"timed updates ({args.timed}, {' '.join(args.set) or 'no overrides'}): median "
              f"{statistics.median(times):.3f} s, range {min(times):.3f}-{max(times):.3f} s")


if __name__ == "__main__":
    main()
