"""Shared pieces of the engine tests.

* ``build_test_model``: the tiny preset, shrunk further (2 layers, hidden 64), via the preset builder;
* ``make_batch``: sequences of very different lengths, left- and right-padded, with a loss mask;
* ``spawn``: run a function in ``world_size`` real processes joined by a real gloo (or NCCL) group;
* ``ENGINES`` / ``engines_with`` / ``engines_with_option``: every registered engine (``test_ddp``
  included), those declaring some capabilities, those with some config option; ``new_engine`` /
  ``train_steps`` / ``save_results``: what a spawned scenario does with them;
* ``toy_stepper`` / ``toy_backward``: an ``OptimizerStepper`` over one small linear layer, for the unit tests;
* the plain single-process PyTorch reference (HF model + AdamW loop, full logits,
  written independently of the engine code) and ``full_grads`` to read an engine's gradients.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

import ddp_engine  # noqa: F401  (registers test_ddp in this process and in every spawned one)
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.engines import ENGINE_REGISTRY, build_engine
from rlflow.engines.base import BaseEngine
from rlflow.engines.common.optim.optimizer_step import OptimizerStepper
from rlflow.engines.config import EngineConfig, LRSchedulerConfig, OptimizerConfig
from rlflow.engines.registry import engines_with  # noqa: F401  (the suites import it from here)
from rlflow.models.presets import build_preset
from rlflow.protocol import DataProto

TEST_MODEL_OPTIONS = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32
)
VOCAB_LIMIT = 300  # token ids drawn below this (the trained tokenizer has ~350 entries)
LR = 1e-3
OPTIMIZER = {"lr": LR, "weight_decay": 0.1, "grad_clip": 1.0, "betas": [0.9, 0.95], "eps": 1e-8}
# cosine after 1 warmup step over 3 steps, floor 0.1: multipliers 1, 1, 0.55
SCHEDULE = {"name": "cosine", "warmup_steps": 1, "total_steps": 3, "min_lr_ratio": 0.1}
REFERENCE_LRS = [LR * 1.0, LR * 1.0, LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))]
ENGINES = tuple(ENGINE_REGISTRY.names())


def engines_with_option(option: str) -> tuple[str, ...]:
    """The registered engines whose config has the field ``option``."""
    return tuple(name for name in ENGINES if option in {f.name for f in fields(ENGINE_REGISTRY.get(name).config_class)})


def build_test_model(folder: Path) -> Path:
    return build_preset(folder, tokenizer_corpus(), preset="tiny", seed=0, **TEST_MODEL_OPTIONS)


def engine_config(name: str, **overrides: Any) -> dict[str, Any]:
    config = {"name": name, "device": "cpu", "optimizer": dict(OPTIMIZER), "lr_scheduler": dict(SCHEDULE)}
    config.update(overrides)
    return config


def make_batch(seed: int, rows: int = 8, width: int = 24) -> DataProto:
    """Rows of 2..width real tokens; even rows left-padded, odd rows right-padded; loss on the last ~2/3."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (rows,), generator=generator)
    lengths[0], lengths[1] = width, 2  # always one full row and one minimal row
    input_ids = torch.randint(0, VOCAB_LIMIT, (rows, width), generator=generator)
    attention_mask = torch.zeros(rows, width, dtype=torch.long)
    loss_mask = torch.zeros(rows, width)
    for row, length in enumerate(lengths.tolist()):
        start = width - length if row % 2 == 0 else 0
        attention_mask[row, start : start + length] = 1
        first_loss = start + max(1, length // 3)
        loss_mask[row, first_loss : start + length] = 1
    weights = torch.rand(rows, width, generator=generator) * 2 - 0.5  # per-token weights (like advantages)
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask, "token_weights": weights}
    )


def make_grouped_batch(seed: int, prompts: int = 3, samples: int = 4, width: int = 24) -> DataProto:
    """GRPO-shaped rows: ``samples`` responses per prompt (left-padded prompt, right-padded response), the loss on
    the responses, each prompt's rows interleaved with the others' (``[p0, p1, p2, p0, ...]``)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_width = width // 3
    prompt_ids = [torch.randint(0, VOCAB_LIMIT, (int(torch.randint(2, prompt_width + 1, (1,), generator=generator)),),
                                generator=generator) for _ in range(prompts)]
    rows = prompts * samples
    input_ids = torch.randint(0, VOCAB_LIMIT, (rows, width), generator=generator)
    attention_mask, loss_mask = torch.zeros(rows, width, dtype=torch.long), torch.zeros(rows, width)
    for row in range(rows):
        prompt = prompt_ids[row % prompts]
        response = int(torch.randint(1, width - prompt_width + 1, (1,), generator=generator))
        input_ids[row, prompt_width - len(prompt):prompt_width] = prompt
        attention_mask[row, prompt_width - len(prompt):prompt_width + response] = 1
        loss_mask[row, prompt_width:prompt_width + response] = 1
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask})


def position_ids_of(attention_mask: torch.Tensor) -> torch.Tensor:
    positions = torch.zeros_like(attention_mask)
    for row in range(attention_mask.shape[0]):
        real = attention_mask[row].nonzero().squeeze(-1)
        positions[row, real] = torch.arange(len(real), device=attention_mask.device)
    return positions


# ------------------------------------------------------------------------------- a toy optimizer step
TOY_SCHEDULE = LRSchedulerConfig(name="linear", warmup_steps=0, total_steps=4, min_lr_ratio=0.0)  # 1, .75, .5, .25


def toy_stepper(grad_clip: float = 1.0) -> tuple[torch.nn.Linear, OptimizerStepper]:
    """A seeded 3 -> 2 linear layer and the ``OptimizerStepper`` of its AdamW (lr 0.1, ``TOY_SCHEDULE``)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    config = EngineConfig(name="x", optimizer=OptimizerConfig(lr=0.1, grad_clip=grad_clip, weight_decay=0.0),
                          lr_scheduler=TOY_SCHEDULE)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.0)

    def clip(max_norm: float) -> float:
        return torch.nn.utils.clip_grad_norm_(layer.parameters(), max_norm).item()

    return layer, OptimizerStepper(optimizer, config, clip)


def toy_backward(layer: torch.nn.Linear, scale: float = 1.0) -> None:
    """Gradients of ``scale`` times the summed output on a batch of ones."""
    (layer(torch.ones(4, 3)).sum() * scale).backward()


# ---------------------------------------------------------------------------- engines in spawned ranks
def new_engine(config: dict[str, Any], model_path: Path, kind: str = "causal_lm") -> BaseEngine:
    engine = build_engine(config, model_path, model_kind=kind)
    engine.initialize()
    return engine


def local_share(batch: DataProto, rank: int, world_size: int) -> DataProto:
    return batch.chunk(world_size)[rank]


def train_steps(engine: BaseEngine, batches: list[DataProto], rank: int, world_size: int) -> dict[str, list]:
    """One token-mean NLL optimizer step per batch (this rank's share); the losses, grad norms and LRs."""
    record: dict[str, list] = {"losses": [], "grad_norms": [], "lrs": []}
    for batch in batches:
        _, metrics = engine.forward_backward(local_share(batch, rank, world_size), nll_token_mean)
        step = engine.optim_step()
        record["losses"].append(metrics["loss"])
        record["grad_norms"].append(step["grad_norm"])
        record["lrs"].append(step["lr"])
    return record


def save_results(rank: int, out_dir: Path, name: str, results: dict[str, Any]) -> None:
    if rank == 0:
        torch.save(results, out_dir / name)


def load_results(folder: Path, name: str) -> dict[str, Any]:
    return torch.load(folder / name, weights_only=False)


# ---------------------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, fn: Callable[..., None], world_size: int, port: int, backend: str, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., None], world_size: int, *args: Any, backend: str = "gloo") -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes joined by a ``backend`` group
    (``nccl``: rank r on GPU r)."""
    mp.start_processes(_entry, args=(fn, world_size, _free_port(), backend, args), nprocs=world_size,
                       start_method="spawn")


def spawned_results(suite: Callable[..., None], world_size: int, preset: str, root: Path) -> list[Any]:
    """Build ``preset`` under ``root``, run ``suite(rank, world_size, model, root)`` on ``world_size`` gloo ranks, and
    load what each rank saved as ``root / f"rank{rank}.pt"``."""
    model = build_preset(root / preset, tokenizer_corpus(), preset=preset, seed=0)
    spawn(suite, world_size, model, root)
    return [torch.load(root / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


# ---------------------------------------------------------------------------- plain reference
def reference_model(model_path: Path, device: str = "cpu") -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa").to(device)


def reference_token_stats(
    model: torch.nn.Module, batch: DataProto, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of each token (of ``target_ids`` where the batch has them) from the full padded logits;
    [B, T] on the CPU, 0 where undefined. The batch goes to the model's device."""
    device = next(model.parameters()).device
    ids, mask = batch.batch["input_ids"].to(device), batch.batch["attention_mask"].to(device)
    scored = batch.batch.get("target_ids", batch.batch["input_ids"]).to(device)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_of(mask), use_cache=False).logits
    log_softmax = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    log_probs = torch.zeros(ids.shape, device=device)
    entropy = torch.zeros(ids.shape, device=device)
    log_probs[:, 1:] = log_softmax.gather(-1, scored[:, 1:, None]).squeeze(-1)
    entropy[:, 1:] = -(log_softmax.exp() * log_softmax).sum(-1)
    defined = torch.zeros(ids.shape, device=device)
    defined[:, 1:] = (mask[:, 1:] * mask[:, :-1]).float()
    return (log_probs * defined).cpu(), (entropy * defined).cpu()


def whole_batch_loss(log_probs: torch.Tensor, batch: DataProto, mode: str, horizon: float) -> torch.Tensor:
    """The mini-batch loss of each aggregation mode, written directly over the whole batch."""
    loss = -log_probs * batch.batch["token_weights"]
    mask = batch.batch["loss_mask"]
    per_seq_sum = (loss * mask).sum(-1)
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum()
    if mode == "token-sum":
        return (loss * mask).sum()
    if mode == "seq-mean-token-sum":
        return per_seq_sum.mean()
    if mode == "seq-mean-token-sum-norm":
        return per_seq_sum.mean() / horizon
    if mode == "seq-mean-token-mean":
        return (per_seq_sum / mask.sum(-1)).mean()
    raise ValueError(mode)


def reference_training(model_path: Path, batches: list[DataProto], device: str = "cpu") -> dict[str, Any]:
    """Plain PyTorch: full batch, token-mean NLL, AdamW (no decay on 1-D params), clip, the schedule's LRs.
    Runs on ``device``; the parameters come back on the CPU."""
    model = reference_model(model_path, device)
    model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": OPTIMIZER["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR,
        betas=tuple(OPTIMIZER["betas"]),
        eps=OPTIMIZER["eps"],
    )
    losses, grad_norms = [], []
    for batch, lr in zip(batches, REFERENCE_LRS):
        log_probs, _ = reference_token_stats(model, batch)
        mask = batch.batch["loss_mask"]
        loss = -(log_probs * mask).sum() / mask.sum()
        loss.backward()
        grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIMIZER["grad_clip"]).item())
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    params = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    return {"losses": losses, "grad_norms": grad_norms, "params": params}


def nll_token_mean(outputs: dict[str, torch.Tensor], micro: DataProto, ctx: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Engine-side loss_fn for the parity runs: token-mean NLL scaled by the global counts."""
    mask = micro.batch["loss_mask"]
    loss = -(outputs["log_probs"] * mask).sum() / ctx.global_num_tokens * ctx.dp_size
    return loss, {"micro_tokens": float(mask.sum())}


def full_grads(engine: Any) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient under HF names (collective; DDP, FSDP1 and FSDP2 aware; an engine with
    its own parameter names maps them with the hook its HF export uses)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    def hf_name(name: str) -> str:
        return name.replace("_fsdp_wrapped_module.", "").removeprefix("model.")

    if engine.config.name == "megatron":  # grads in megatron DDP's buffers (main_grad), whole at TP = PP = 1
        from rlflow.engines.megatron.model import model_shape, megatron_names
        from rlflow.engines.megatron.weights import hf_from_whole

        shape = model_shape(engine.plan.hf, engine.plan.layout)
        return {hf: grad for name, param in megatron_names(engine.stage)
                for hf, grad in hf_from_whole(name, param.main_grad.clone(), shape)}

    module = engine.module.module if isinstance(engine.module, DistributedDataParallel) else engine.module
    if isinstance(module, FSDP):
        with FSDP.summon_full_params(module, with_grads=True, writeback=False):
            return {hf_name(n): p.grad.detach().clone() for n, p in module.named_parameters()}
    grads = {}
    for name, param in module.named_parameters():
        grad = param.grad
        grads[name] = grad.full_tensor() if isinstance(grad, DTensor) else grad.detach().clone()
    to_hf = getattr(engine, "_hf_named_tensors", None)  # a model with its own names (torchtitan) maps them as it exports
    return dict(to_hf(iter(grads.items()), None)) if to_hf else {hf_name(name): grad for name, grad in grads.items()}
