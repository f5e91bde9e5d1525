"""Step time at batch x1, x2, x4 and model x1, x2, x4, against linear FLOP scaling.

    python bench/scaling.py [--prompts 4] [--n 2] [--prompt-len 16] [--max-new-tokens 32] [--layers 2] [--rounds 3]
                            [--json PATH]

A step here is the compute of one GRPO step at world size 1, in one process on one thread:
``generate`` of the HF rollout backend (``--prompts`` x ``--n`` samples, temperature 1), then
the fsdp2 engine's ``forward_backward`` (token-mean NLL over the generated sequences, one micro
batch) and ``optim_step`` (AdamW). No Ray, no weight sync (bench/weight_sync.py times that).

Model x1/x2/x4 is the ``small`` preset with ``--layers`` x1, x2, x4 decoder layers, so its
non-embedding parameters scale x2, x4; batch x1/x2/x4 multiplies ``--prompts``. Each point's
FLOPs are ``2 * P * generated tokens + 6 * P * trained tokens`` counted from the run (P: the
parameters that take part in matmuls, the LM head included, the input embedding lookup not).
The ratio of a point is (its step time / x1's) / (its FLOPs / x1's): 1.0 is linear scaling,
above 1 means the larger point costs more than its FLOPs (informational rows; the issue sets no
target). Rounds alternate over the points; each point's time is the median over rounds. Each point's
phases (generation; update = forward_backward + optim_step) go to the step-breakdown figure.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from transformers import AutoModelForCausalLM

from rlflow.config.schema import RolloutConfig, SamplingConfig
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.engines import build_engine
from rlflow.models.presets import build_preset
from rlflow.protocol import DataProto
from rlflow.rollout import build_rollout
from rlflow.utils.device import limit_cpu_threads

from machine import machine_line
from results import BenchResult, Row, write_result
from rollout_throughput import make_prompts

FACTORS = (1, 2, 4)


def matmul_params(model_path: Path) -> int:
    """Parameters that enter a matmul per token: all of them, less an untied input embedding (a lookup)."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    return total if tied else total - embedding.numel()


def make_step(model_path: Path, prompts: DataProto, sampling: SamplingConfig, config: RolloutConfig,
              closers: list[Callable[[], None]]) -> tuple[Callable[[], tuple[float, float, float]], int]:
    """A step function returning (generate seconds, update seconds, FLOPs) and the model's matmul parameter count."""
    rollout = build_rollout(replace(config, name="hf"), model_path, "cpu")
    closers.append(rollout.shutdown)
    engine = build_engine({"name": "fsdp2", "device": "cpu", "micro_batch_size": 10**6, "optimizer": {"lr": 1e-5}}, model_path)
    engine.initialize()
    params = matmul_params(model_path)

    def loss_fn(outputs, micro, ctx):
        loss_mask = micro.batch["loss_mask"]
        return -(outputs["log_probs"] * loss_mask).sum() / ctx.global_num_tokens * ctx.dp_size, {}

    def step() -> tuple[float, float, float]:
        start = time.perf_counter()
        out = rollout.generate(prompts, sampling)
        generated_at = time.perf_counter()
        mask = out.batch["attention_mask"]
        loss_mask = mask.float()
        loss_mask[:, 0] = 0
        batch = DataProto.from_dict({"input_ids": out.batch["input_ids"], "attention_mask": mask,
                                     "position_ids": out.batch["position_ids"], "loss_mask": loss_mask})
        engine.forward_backward(batch, loss_fn)
        engine.optim_step()
        update_s = time.perf_counter() - generated_at
        generated, trained = int(out.batch["response_mask"].sum()), int(mask.sum())
        return generated_at - start, update_s, 2.0 * params * generated + 6.0 * params * trained

    return step, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4, help="prompts at batch x1")
    parser.add_argument("--n", type=int, default=2, help="samples per prompt")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2, help="decoder layers at model x1 (small preset shape)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the result file (bench/results.py) here")
    args = parser.parse_args()
    print(machine_line())
    limit_cpu_threads(1)
    sampling = SamplingConfig(n=args.n, temperature=1.0, seed=0, max_new_tokens=args.max_new_tokens)
    config = RolloutConfig(prompt_length=args.prompt_len, response_length=args.max_new_tokens)
    root = Path(tempfile.mkdtemp(prefix="scaling-bench-"))
    models = {f: build_preset(root / f"model-x{f}", tokenizer_corpus(), preset="small", seed=0,
                              num_hidden_layers=args.layers * f) for f in FACTORS}
    points = {f"batch x{f}": (models[1], f * args.prompts) for f in FACTORS}
    points.update({f"model x{f}": (models[f], args.prompts) for f in FACTORS[1:]})
    closers: list[Callable[[], None]] = []
    steps, params = {}, {}
    try:
        for name, (path, prompt_count) in points.items():
            prompts = make_prompts(prompt_count, vocab=300, min_len=args.prompt_len // 2, max_len=args.prompt_len)
            steps[name], params[name] = make_step(path, prompts, sampling, config, closers)
            steps[name]()  # warm-up
        measured: dict[str, list[tuple[float, float, float]]] = {name: [] for name in steps}
        for round_index in range(args.rounds):
            for name in sorted(steps, reverse=round_index % 2 == 1):
                measured[name].append(steps[name]())
    finally:
        for close in closers:
            close()
    seconds = {name: statistics.median(g + u for g, u, _ in runs) for name, runs in measured.items()}
    flops = {name: statistics.median(f for _, _, f in runs) for name, runs in measured.items()}
    breakdown = {name: {"generation": statistics.median(g for g, _, _ in runs),
                        "update": statistics.median(u for _, u, _ in runs)}
                 for name, runs in measured.items()}
    settings = (f"small preset shape, {args.layers} layers at x1 ({params['batch x1'] / 1e6:.2f}M matmul params); "
                f"{args.prompts} prompts x {args.n} samples at x1, prompts up to {args.prompt_len} tokens, up to "
                f"{args.max_new_tokens} new; fp32, 1 thread; medians of {args.rounds} rounds")
    print(settings)
    result = BenchResult(bench="scaling", title="Step time scaling vs linear FLOP scaling", breakdown=breakdown, notes=[
        settings, "a ratio below 1: the x1 step carries per-step costs that do not grow with FLOPs (at these small "
        "defaults mostly HF generate's per-token Python work), so a larger point is cheaper than linear"])
    for name in ("batch x2", "batch x4", "model x2", "model x4"):
        time_ratio, flop_ratio = seconds[name] / seconds["batch x1"], flops[name] / flops["batch x1"]
        print(f"  {name}: {seconds[name]:.3f} s/step ({time_ratio:.2f}x time, {flop_ratio:.2f}x FLOPs) "
              f"-> {time_ratio / flop_ratio:.3f} of linear")
        result.rows.append(Row(name=f"{name} step", value=seconds[name], baseline_name="x1 step x FLOP ratio",
                               baseline=seconds["batch x1"] * flop_ratio, unit="s", ratio=time_ratio / flop_ratio,
                               ratio_meaning="time ratio / FLOP ratio (informational)"))
    write_result(args.json, result)


if __name__ == "__main__":
    main()
