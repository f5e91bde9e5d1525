"""What ``test_engine_cuda.py`` runs on one GPU (an NCCL group of one rank), its engines in one launch.

For each engine, on ``cuda``:

* token log-probs and entropy of a padded probe batch, to compare with the HF model's on the same GPU;
* 3 optimizer steps (fp32) on the parity batches, to compare with plain PyTorch on the same GPU;
* the same 3 steps with ``param_offload`` and ``optimizer_offload``: the GPU memory held while
  offloaded and after ``onload`` (host and device are different memory here, unlike on the CPU
  machines; the megatron engine parks parameters in host memory without changing their device), and
  where the optimizer state lives between steps;
* for engines with ``MIXED_PRECISION``: one bf16-compute step with its fp32 master weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engine_testlib import (
    engine_config,
    engines_with,
    make_batch,
    new_engine,
    nll_token_mean,
    position_ids_of,
    reference_model,
    reference_token_stats,
    reference_training,
    save_results,
    train_steps,
)
from rlflow.engines.base import BaseEngine, Capability
from rlflow.protocol import DataProto

DEVICE = "cuda"


def probe_batch() -> DataProto:
    batch = make_batch(seed=51, rows=7, width=40)
    batch.batch["position_ids"] = position_ids_of(batch.batch["attention_mask"])
    batch.meta_info.update(compute_entropy=True)
    return batch


def _param_devices(engine: BaseEngine) -> set[str]:
    return {param.device.type for param in engine.module.parameters()}


def _optimizer_devices(engine: BaseEngine) -> set[str]:
    """Device types of the optimizer state's tensors (AdamW's moments; not the step counters)."""
    return {value.device.type for state in engine.optimizer.state.values()
            for value in state.values() if torch.is_tensor(value) and value.dim() > 0}


def _fp32_runs(name: str, model_path: Path, batches: list[DataProto], probe: DataProto) -> dict[str, Any]:
    engine = new_engine(engine_config(name, device=DEVICE, micro_batch_size=4), model_path)
    out, _ = engine.forward_backward(probe, forward_only=True)
    record = train_steps(engine, batches, 0, 1)
    record["params"] = {n: t.detach().cpu().clone() for n, t in engine.export_hf_weights()}
    record["log_probs"], record["entropy"] = out.batch["log_probs"].cpu(), out.batch["entropy"].cpu()
    record["state_devices"] = _param_devices(engine) | _optimizer_devices(engine)
    del engine, out
    torch.cuda.empty_cache()
    return record


def _offloaded_runs(name: str, model_path: Path, batches: list[DataProto]) -> dict[str, Any]:
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()
    config = engine_config(name, device=DEVICE, micro_batch_size=4, param_offload=True, optimizer_offload=True)
    engine = new_engine(config, model_path)
    record = train_steps(engine, batches, 0, 1)
    torch.cuda.empty_cache()
    record["held_while_offloaded"] = torch.cuda.memory_allocated() - baseline
    record["offloaded_optimizer_devices"] = _optimizer_devices(engine)
    engine.onload()
    record["held_after_onload"] = torch.cuda.memory_allocated() - baseline
    record["onloaded_param_devices"] = _param_devices(engine)
    record["param_bytes"] = sum(p.numel() * p.element_size() for p in engine.module.parameters())
    del engine
    torch.cuda.empty_cache()
    return record


def cuda_suite(rank: int, world_size: int, model_path: Path, out_dir: Path, engines: tuple[str, ...]) -> None:
    batches = [make_batch(seed) for seed in range(3)]
    probe = probe_batch()
    results: dict[str, Any] = {"reference": reference_training(model_path, batches, DEVICE)}
    with torch.no_grad():
        results["reference_stats"] = reference_token_stats(reference_model(model_path, DEVICE), probe)
    for name in engines:
        results[name] = _fp32_runs(name, model_path, batches, probe)
        results[(name, "offload")] = _offloaded_runs(name, model_path, batches)
    for name in engines_with(Capability.MIXED_PRECISION, among=engines):
        mixed = new_engine(engine_config(name, device=DEVICE, micro_batch_size=4, param_dtype="bfloat16"), model_path)
        _, metrics = mixed.forward_backward(batches[0], nll_token_mean)
        results[(name, "bf16")] = {
            "loss": metrics["loss"],
            "step": mixed.optim_step(),
            "master_dtypes": {t.dtype for _, t in mixed.export_hf_weights()},
        }
        del mixed
    save_results(rank, out_dir, "cuda.pt", results)
