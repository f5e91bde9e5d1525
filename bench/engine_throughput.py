"""Training throughput of each engine against a plain PyTorch loop on the same model.

One process, world size 1. Every contender runs forward + backward + clip + AdamW step
on the same batch of full-length sequences (token-mean NLL), and the rounds are
interleaved so machine load hits all contenders alike. Prints tokens/s per contender
and each engine's ratio to the plain loop (target >= 0.9).

    python bench/engine_throughput.py [--size small] [--rows 8] [--seq-len 256] [--rounds 3] [--engines NAME ...]
                                      [--device cpu|cuda] [--param-dtype float32|bfloat16] [--no-variants]
                                      [--json PATH]

``--param-dtype bfloat16`` is bf16 compute with fp32 master weights: the engines' mixed precision
against the plain loop under ``torch.autocast`` (only engines with ``Capability.MIXED_PRECISION``).

The engines are every registered one (``ENGINE_REGISTRY.names()``) unless ``--engines`` names some,
plus the registered engines' switches that exist for speed (``VARIANTS``: fsdp2's per-layer and
torchtitan's per-block ``torch.compile``), each its own contender.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.engines import ENGINE_REGISTRY, build_engine
from rlflow.engines.base import Capability
from rlflow.models.presets import build_preset
from rlflow.protocol import DataProto
from rlflow.utils.device import limit_cpu_threads

from machine import machine_line
from results import BenchResult, Row, write_result

TARGET = 0.9
# contender name -> (engine, config overrides): switches whose effect is speed, measured beside their engine
VARIANTS: dict[str, tuple[str, dict]] = {
    "fsdp2+compile": ("fsdp2", {"compile": True}),
    "torchtitan+compile": ("torchtitan", {"compile": True}),
}


def make_batch(rows: int, seq_len: int, vocab: int) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (rows, seq_len), generator=generator)
    mask = torch.ones(rows, seq_len, dtype=torch.long)
    loss_mask = mask.float()
    loss_mask[:, 0] = 0
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "loss_mask": loss_mask})


def plain_step_fn(model_path: Path, batch: DataProto, device: str, param_dtype: str) -> Callable[[], None]:
    """The baseline: HF forward with full logits (under bf16 autocast for bf16 compute), masked token-mean
    NLL, clip, AdamW with torch's default kernels (the engines' default ``foreach``; the same arithmetic as
    torch's for-loop on a CPU); fp32 weights."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids, mask, loss_mask = (batch.batch[key].to(device) for key in ("input_ids", "attention_mask", "loss_mask"))
    compute_dtype = getattr(torch, param_dtype)

    def step() -> None:
        with torch.autocast(torch.device(device).type, dtype=compute_dtype, enabled=compute_dtype != torch.float32):
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        log_probs = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(log_probs * loss_mask[:, 1:]).sum() / loss_mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def engine_step_fn(name: str, model_path: Path, batch: DataProto, **overrides: object) -> Callable[[], None]:
    config = {"name": name, "micro_batch_size": len(batch), "optimizer": {"lr": 1e-5}, **overrides}
    engine = build_engine(config, model_path)
    engine.initialize()

    def loss_fn(outputs, micro, ctx):
        loss_mask = micro.batch["loss_mask"]
        return -(outputs["log_probs"] * loss_mask).sum() / ctx.global_num_tokens * ctx.dp_size, {}

    def step() -> None:
        engine.forward_backward(batch, loss_fn)
        engine.optim_step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="small", help="preset name (rlflow.models.presets.PRESETS)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps-per-round", type=int, default=3)
    parser.add_argument("--engines", nargs="*", default=ENGINE_REGISTRY.names(), help="default: every registered engine")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (then a one-rank NCCL group)")
    parser.add_argument("--param-dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype")
    parser.add_argument("--no-variants", action="store_true", help="leave out VARIANTS (e.g. torchtitan+compile)")
    parser.add_argument("--json", default=None, help="write the result file (bench/results.py) here")
    args = parser.parse_args()
    print(machine_line())
    limit_cpu_threads(1)
    common = {"device": args.device, "param_dtype": args.param_dtype}
    engines = [name for name in args.engines if args.param_dtype == "float32"
               or Capability.MIXED_PRECISION in ENGINE_REGISTRY.get(name).capabilities]
    variants = {} if args.no_variants else VARIANTS
    synchronize = torch.cuda.synchronize if torch.device(args.device).type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = build_preset(Path(tmp) / "model", tokenizer_corpus(), preset=args.size, seed=0)
        vocab = AutoModelForCausalLM.from_pretrained(model_path).config.vocab_size
        batch = make_batch(args.rows, args.seq_len, vocab)
        contenders = {"plain": plain_step_fn(model_path, batch, args.device, args.param_dtype)}
        contenders.update({name: engine_step_fn(name, model_path, batch, **common) for name in engines})
        contenders.update({label: engine_step_fn(name, model_path, batch, **common, **overrides)
                           for label, (name, overrides) in variants.items() if name in engines})
        for step in contenders.values():  # warm-up: allocator, optimizer state, first-call overheads
            step()
        seconds: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, step in contenders.items():
                synchronize()
                start = time.perf_counter()
                for _ in range(args.steps_per_round):
                    step()
                synchronize()
                seconds[name].append((time.perf_counter() - start) / args.steps_per_round)
    tokens = args.rows * args.seq_len
    speed = {name: tokens / statistics.median(times) for name, times in seconds.items()}
    threads = "" if args.device != "cpu" else ", 1 thread"
    settings = (f"model preset={args.size}, batch {args.rows} x {args.seq_len} tokens, {args.device}, "
                f"compute {args.param_dtype}{threads}, world size 1")
    print(settings)
    result = BenchResult(bench="engine_throughput",
                         title=f"Engine training throughput vs a plain PyTorch loop ({args.device}, {args.param_dtype} compute)",
                         notes=[settings, f"medians of {args.rounds} interleaved rounds of {args.steps_per_round} steps"])
    for name, tokens_per_s in speed.items():
        ratio = tokens_per_s / speed["plain"]
        verdict = "" if name == "plain" else f"  ratio vs plain {ratio:.3f} ({'ok' if ratio >= TARGET else 'below'} target {TARGET})"
        print(f"  {name:18s} {tokens_per_s:9.0f} tokens/s{verdict}")
        if name != "plain":
            result.rows.append(Row(name=f"{name} forward+backward+AdamW", value=tokens_per_s, baseline_name="plain loop",
                                   baseline=speed["plain"], unit="tokens/s", ratio=ratio, ratio_meaning="value / baseline",
                                   target=f">= {TARGET}", met=ratio >= TARGET))
    write_result(args.json, result)

if __name__ == "__main__":
    main()
