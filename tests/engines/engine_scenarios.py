"""What each spawned engine process runs; rank 0 saves the results for the pytest process to check.

One launch runs many configurations in sequence (process start-up dominates the cost).
Every function has the ``spawn`` signature ``fn(rank, world_size, *args)``.

The engines are every registered one (``engine_testlib.ENGINES``: the built-in engines and
``test_ddp`` from ``ddp_engine``). The checkpoint scenarios are in ``checkpoint_scenarios``.
A scenario that needs an optional feature runs on ``engines_with(capability)``: the engines
whose class declares it (``BaseEngine.capabilities``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from checkpoint_scenarios import checkpoint_errors_suite, checkpoint_suite, reshard_suite, resume_after_kill
from engine_testlib import (
    ENGINES,
    VOCAB_LIMIT,
    engine_config,
    engines_with,
    engines_with_option,
    full_grads,
    local_share,
    make_batch,
    make_grouped_batch,
    new_engine,
    nll_token_mean,
    position_ids_of,
    reference_model,
    reference_token_stats,
    reference_training,
    save_results,
    train_steps,
    whole_batch_loss,
)
from rlflow.algos import agg_loss, loss_agg_modes
from rlflow.engines.base import Capability
from rlflow.protocol import DataProto

HORIZON = 24.0


def parity_configs(world_size: int) -> dict[str, dict[str, Any]]:
    configs = {
        f"{name}-rmpad{int(rp)}-mbs{mbs}": engine_config(name, use_remove_padding=rp, micro_batch_size=mbs)
        for name in ENGINES
        for rp in (True, False)
        for mbs in (1, 4)
    }
    for name in ENGINES:
        configs[f"{name}-dynamic"] = engine_config(name, use_dynamic_bsz=True, max_token_len_per_micro_batch=30)
    if world_size == 1:
        for name in ENGINES:
            configs[f"{name}-gradckpt"] = engine_config(name, gradient_checkpointing=True, micro_batch_size=4)
    if world_size == 2:
        configs["fsdp2-hybrid"] = engine_config("fsdp2", hybrid_replicate_size=2, micro_batch_size=2)
        for name in engines_with_option("compile"):
            configs[f"{name}-compile"] = engine_config(name, compile=True, micro_batch_size=1)
    return configs


def compiled_graphs() -> int:
    """How many graphs torch.compile has built in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def parity_suite(rank: int, world_size: int, model_path: Path, out_dir: Path) -> None:
    """Every configuration trains 3 steps on the same 3 batches; the plain reference runs on rank 0."""
    batches = [make_batch(seed) for seed in range(3)]
    results: dict[str, Any] = {"reference": reference_training(model_path, batches) if rank == 0 else None}
    for label, config in parity_configs(world_size).items():
        graphs_before = compiled_graphs()
        engine = new_engine(config, model_path)
        record = train_steps(engine, batches, rank, world_size)
        record["compiled_graphs"] = compiled_graphs() - graphs_before
        record["params"] = {name: tensor.clone() for name, tensor in engine.export_hf_weights()}
        results[label] = record
    save_results(rank, out_dir, f"parity_ws{world_size}.pt", results)


def _agg_loss_fn(mode: str):
    def loss_fn(outputs, micro, ctx):
        loss_mat = -outputs["log_probs"] * micro.batch["token_weights"]
        loss = agg_loss(
            loss_mat,
            micro.batch["loss_mask"],
            mode,
            dp_size=ctx.dp_size,
            batch_num_tokens=ctx.global_num_tokens,
            global_batch_size=ctx.global_num_seqs,
            loss_scale_factor=HORIZON,
        )
        return loss, {}

    return loss_fn


FSDP2_REDUCE_EVERY_MICRO = "fsdp2/defer_grad_reduce=false"  # fsdp2 reducing every micro-batch (the default defers)


def grad_accumulation_suite(rank: int, world_size: int, model_path: Path, out_dir: Path) -> None:
    """Each loss_agg_mode: 8 rows -> 4 per rank -> 4 micro-batches of 1 per rank; gradients vs one whole-batch pass."""
    batch = make_batch(seed=11)
    results: dict[str, Any] = {}
    if rank == 0:
        model = reference_model(model_path)
        for mode in loss_agg_modes():
            model.zero_grad()
            log_probs, _ = reference_token_stats(model, batch)
            loss = whole_batch_loss(log_probs, batch, mode, HORIZON)
            loss.backward()
            results[("reference", mode)] = {
                "loss": loss.item(),
                "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
            }
    variants = {name: engine_config(name, micro_batch_size=1) for name in ENGINES}
    variants[FSDP2_REDUCE_EVERY_MICRO] = engine_config("fsdp2", micro_batch_size=1, defer_grad_reduce=False)
    for name, config in variants.items():
        engine = new_engine(config, model_path)
        for mode in loss_agg_modes():
            engine.zero_grad()
            _, metrics = engine.forward_backward(local_share(batch, rank, world_size), _agg_loss_fn(mode))
            results[(name, mode)] = {
                "loss": metrics["loss"],
                "num_micro_batches": metrics["num_micro_batches"],
                "grads": full_grads(engine),
            }
    save_results(rank, out_dir, "grad_accumulation.pt", results)


def export_suite(rank: int, world_size: int, model_path: Path, out_dir: Path) -> None:
    """One training step, then save_hf; rank 0 reloads with transformers and compares log-probs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    batch = make_batch(seed=31)
    results: dict[str, Any] = {}
    for name in ENGINES:
        engine = new_engine(engine_config(name, micro_batch_size=2), model_path)
        train_steps(engine, [make_batch(seed=30)], rank, world_size)
        folder = out_dir / f"hf_{name}"
        engine.save_hf(folder)
        exported = {n: t.clone() for n, t in engine.export_hf_weights()}
        as_bf16 = {n: t.clone() for n, t in engine.export_hf_weights(torch.bfloat16)}
        engine_out, _ = engine.forward_backward(batch, forward_only=True)
        if rank == 0:
            loaded, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
            with torch.no_grad():
                hf_log_probs, _ = reference_token_stats(loaded, batch)
            results[name] = {
                "missing": list(info["missing_keys"]),
                "unexpected": list(info["unexpected_keys"]),
                "max_logprob_diff": (hf_log_probs - engine_out.batch["log_probs"]).abs().max().item(),
                "max_weight_diff": max((loaded.state_dict()[n] - t).abs().max().item() for n, t in exported.items()),
                "exported_names": sorted(exported),
                "bf16_export_order_kept": list(as_bf16) == list(exported),
                "bf16_export_is_the_cast": all(
                    as_bf16[n].dtype == torch.bfloat16 and torch.equal(as_bf16[n], t.to(torch.bfloat16)) for n, t in exported.items()
                ),
                "stored_dtypes": {t.dtype for t in exported.values()},
                "hf_names": sorted(loaded.state_dict()),
                "tokenizer_vocab": len(AutoTokenizer.from_pretrained(folder)),
                "files": sorted(os.listdir(folder)),
            }
    save_results(rank, out_dir, "export.pt", results)


def value_suite(rank: int, world_size: int, model_path: Path, value_path: Path, out_dir: Path) -> None:
    """Value model (an HF sequence-classification folder): values vs the HF model run directly, packed vs
    padded, training, save/reload in the HF class, and a fresh head on a causal-LM folder."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rlflow.models.value_models import load_value_model

    batch = make_batch(seed=41)
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]

    def direct_values(folder: Path) -> torch.Tensor:
        model = AutoModelForSequenceClassification.from_pretrained(folder)
        with torch.no_grad():
            hidden = model.model(ids, attention_mask=mask, position_ids=position_ids_of(mask)).last_hidden_state
            return model.score(hidden).squeeze(-1) * mask

    def value_loss(outputs, micro, ctx):
        loss_mask = micro.batch["loss_mask"]
        return ((outputs["values"] - 1.0) ** 2 * loss_mask).sum() / ctx.global_num_tokens * ctx.dp_size, {}

    results: dict[str, Any] = {"direct": direct_values(value_path) if rank == 0 else None}
    for name in engines_with(Capability.VALUE_MODEL):
        engines = {
            rp: new_engine(engine_config(name, use_remove_padding=rp, micro_batch_size=3), value_path, kind="value")
            for rp in (True, False)
        }
        for rp, engine in engines.items():
            out, _ = engine.forward_backward(batch, forward_only=True)
            results[(name, rp)] = out.batch["values"] * mask
        engine = engines[True]
        engine.forward_backward(local_share(batch, rank, world_size), value_loss)
        engine.optim_step()
        trained, _ = engine.forward_backward(batch, forward_only=True)
        folder = out_dir / f"value_{name}"
        engine.save_hf(folder)
        fresh = new_engine(engine_config(name), model_path, kind="value")  # a causal-LM folder: fresh head
        fresh_head = {n: t.clone() for n, t in fresh.export_hf_weights() if n.startswith("score.")}
        fresh_folder = out_dir / f"fresh_value_{name}"
        fresh.save_hf(fresh_folder)
        if rank == 0:
            torch.manual_seed(engine_config(name).get("seed", 0))
            expected_head = {n: t for n, t in load_value_model(model_path).state_dict().items() if n.startswith("score.")}
            results[(name, "saved")] = {
                "engine": trained.batch["values"] * mask,
                "reloaded": direct_values(folder),
                "files": sorted(os.listdir(folder)),
                "architectures": AutoConfig.from_pretrained(folder).architectures,
                "fresh_architectures": AutoConfig.from_pretrained(fresh_folder).architectures,
                "fresh_head": fresh_head,
                "expected_fresh_head": expected_head,
            }
    save_results(rank, out_dir, "value.pt", results)


def packing_suite(rank: int, world_size: int, model_path: Path, out_dir: Path) -> None:
    """Packed vs padded forwards (and the full-logits reference) with temperature and entropy; shared prompts laid
    out once, over several dynamic micro-batches."""
    batch = make_batch(seed=51, rows=7, width=40)
    batch.batch["position_ids"] = position_ids_of(batch.batch["attention_mask"])
    batch.meta_info.update(temperature=0.7, compute_entropy=True)
    results: dict[str, Any] = {}
    with torch.no_grad():
        results["reference"] = reference_token_stats(reference_model(model_path), batch, temperature=0.7)
    for name in ENGINES:
        for label, overrides in {
            "packed": dict(use_remove_padding=True, micro_batch_size=3),
            "padded": dict(use_remove_padding=False, micro_batch_size=3),
            "dynamic": dict(use_remove_padding=True, use_dynamic_bsz=True, max_token_len_per_micro_batch=50),
            "small_chunks": dict(use_remove_padding=True, micro_batch_size=7, logprob_chunk_size=5),
        }.items():
            engine = new_engine(engine_config(name, **overrides), model_path)
            out, metrics = engine.forward_backward(batch, forward_only=True)
            results[(name, label)] = {
                "log_probs": out.batch["log_probs"],
                "entropy": out.batch["entropy"],
                "num_micro_batches": metrics["num_micro_batches"],
            }
    targeted = make_batch(seed=53, rows=5, width=20)  # a Tinker datum's own targets, e.g. 0 at prompt positions
    targeted.batch["target_ids"] = torch.randint(0, VOCAB_LIMIT, (5, 20), generator=torch.Generator().manual_seed(53))
    untargeted = DataProto.from_dict({key: value for key, value in targeted.batch.items() if key != "target_ids"})
    with torch.no_grad():
        hf_model = reference_model(model_path)
        results["targets_reference"] = reference_token_stats(hf_model, targeted)[0]
        results["targets_untargeted"] = reference_token_stats(hf_model, untargeted)[0]
    for name in ENGINES:
        for packed in (True, False):
            engine = new_engine(engine_config(name, use_remove_padding=packed, micro_batch_size=2), model_path)
            results[(name, "targets", packed)] = engine.forward_backward(targeted, forward_only=True)[0].batch["log_probs"]
    grouped = make_grouped_batch(seed=52)
    with torch.no_grad():
        results["grouped_reference"] = reference_token_stats(reference_model(model_path), grouped)[0]
    for name in engines_with_option("share_prefix"):
        shared = dict(attn_implementation="sdpa_varlen", share_prefix=True, use_dynamic_bsz=True,
                      max_token_len_per_micro_batch=60)
        engine = new_engine(engine_config(name, **shared), model_path)
        out, metrics = engine.forward_backward(grouped, forward_only=True)
        results[(name, "shared_prefix")] = {"log_probs": out.batch["log_probs"],
                                            "num_micro_batches": metrics["num_micro_batches"]}
    save_results(rank, out_dir, "packing.pt", results)


def behaviour_suite(rank: int, world_size: int, model_path: Path, out_dir: Path) -> None:
    """Non-finite skip, one-step LR override, modes, offload; bf16 compute with fp32 master weights."""
    results: dict[str, Any] = {}
    batch = make_batch(seed=71)
    for name in ENGINES:
        config = engine_config(name, micro_batch_size=4, param_offload=True, optimizer_offload=True)
        engine = new_engine(config, model_path)
        before = {n: t.clone() for n, t in engine.export_hf_weights()}

        def poisoned(outputs, micro, ctx):
            loss, metrics = nll_token_mean(outputs, micro, ctx)
            return loss * float("nan"), metrics

        engine.forward_backward(batch, poisoned)
        skipped = engine.optim_step()
        after_skip = {n: t.clone() for n, t in engine.export_hf_weights()}
        engine.forward_backward(batch, nll_token_mean)
        overridden = engine.optim_step(lr=0.0)  # lr 0: AdamW moves nothing but weight decay x 0
        after_zero_lr = {n: t.clone() for n, t in engine.export_hf_weights()}
        engine.forward_backward(batch, nll_token_mean)
        scheduled = engine.optim_step()
        probe_before, _ = engine.forward_backward(batch, forward_only=True)
        engine.offload()
        engine.onload()
        probe_after, _ = engine.forward_backward(batch, forward_only=True)
        with engine.eval_mode():
            inside_eval = engine.module.training
        results[name] = {
            "skipped": skipped,
            "unchanged_after_skip": all(torch.equal(before[n], after_skip[n]) for n in before),
            "overridden": overridden,
            "unchanged_after_zero_lr": all(torch.equal(before[n], after_zero_lr[n]) for n in before),
            "scheduled": scheduled,
            "offload_round_trip": torch.equal(probe_before.batch["log_probs"], probe_after.batch["log_probs"]),
            "inside_eval": inside_eval,
            "after_eval": engine.module.training,
        }
    for name in engines_with(Capability.MIXED_PRECISION):
        mixed = new_engine(engine_config(name, micro_batch_size=4, param_dtype="bfloat16"), model_path)
        _, mixed_metrics = mixed.forward_backward(batch, nll_token_mean)
        results[(name, "bf16")] = {
            "loss": mixed_metrics["loss"],
            "step": mixed.optim_step(),
            "master_dtypes": {t.dtype for _, t in mixed.export_hf_weights()},
        }
    with torch.no_grad():
        log_probs, _ = reference_token_stats(reference_model(model_path), batch)
    results["fp32_loss"] = (-(log_probs * batch.batch["loss_mask"]).sum() / batch.batch["loss_mask"].sum()).item()
    save_results(rank, out_dir, "behaviour.pt", results)


def two_rank_suites(rank: int, world_size: int, model_path: Path, value_path: Path, out_dir: Path) -> None:
    """Everything that needs 2 ranks, in one launch."""
    parity_suite(rank, world_size, model_path, out_dir)
    grad_accumulation_suite(rank, world_size, model_path, out_dir)
    checkpoint_suite(rank, world_size, model_path, out_dir)
    export_suite(rank, world_size, model_path, out_dir)
    value_suite(rank, world_size, model_path, value_path, out_dir)


def one_rank_suites(rank: int, world_size: int, model_path: Path, two_rank_out: Path, out_dir: Path) -> None:
    """Everything at world size 1, in one launch (after the 2-rank launch and the killed save)."""
    parity_suite(rank, world_size, model_path, out_dir)
    packing_suite(rank, world_size, model_path, out_dir)
    behaviour_suite(rank, world_size, model_path, out_dir)
    checkpoint_errors_suite(rank, world_size, model_path, two_rank_out, out_dir)
    resume_after_kill(rank, world_size, model_path, out_dir)
    reshard_suite(rank, world_size, model_path, two_rank_out, out_dir)
