"""The torchtitan engine at ``pipeline_parallel_size=2`` (issue 44): torchtitan's split, torch's schedules.

Two gloo ranks, one pipeline of two stages (``tiny-llama``: 4 layers, two a stage; untied embeddings), against
plain PyTorch on the HF model (``engine_testlib.reference_training``: the same batches, token-mean NLL, AdamW,
clipping, schedule):

* log-probs of a batch, packed and padded, match ``transformers`` (<= 1e-4), several micro-batches per call;
* three optimizer steps (dynamic micro-batches, so the pipeline runs several per step): the losses and grad
  norms match the reference within 1e-5 (relative), and the exported weights after training (every stage's,
  gathered on every rank) within 1e-5 (relative L2 over the model; any one weight within 5e-5); with ``GPipe`` too;
* only the last stage collects, both stages report data-parallel rank 0 of 1;
* a checkpoint saved after step 2 and loaded into a fresh engine takes the same step 3;
* ``save_hf`` after training loads into ``AutoModelForCausalLM`` with the engine's log-probs.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine_testlib import (
    engine_config,
    make_batch,
    new_engine,
    nll_token_mean,
    reference_token_stats,
    reference_training,
    spawned_results,
)
from rlflow.meta_info import TEMPERATURE

ATOL = 1e-4  # log-probs, fp32, different kernels: measured ~1e-6
RTOL = 1e-5  # losses, grad norms and the whole model's weights (relative L2) against the plain PyTorch loop
WEIGHT_ATOL = 5e-5  # any one weight: AdamW's normalised step magnifies float noise where a gradient is near 0
SEEDS = (40, 41, 42)
SCHEDULES = ("1F1B", "GPipe")


def _config(schedule: str, **extra: Any) -> dict[str, Any]:
    return engine_config("torchtitan", pipeline_parallel_size=2, pipeline_parallel_schedule=schedule, **extra)


def _log_probs(engine: Any, batch) -> torch.Tensor:
    batch.meta_info[TEMPERATURE.name] = 1.0
    outputs, _ = engine.forward_backward(batch, forward_only=True)
    return outputs.batch["log_probs"] if "log_probs" in outputs.batch else torch.empty(0)


def _step(engine: Any, seed: int) -> tuple[float, float]:
    _, metrics = engine.forward_backward(make_batch(seed), nll_token_mean)
    return metrics["loss"], engine.optim_step()["grad_norm"]


def suite(rank: int, world_size: int, model: Path, out: Path) -> None:
    results: dict[str, Any] = {}
    for remove_padding in (True, False):
        engine = new_engine(_config("1F1B", micro_batch_size=3, use_remove_padding=remove_padding), model)
        results[("log_probs", remove_padding)] = _log_probs(engine, make_batch(seed=5))
        del engine
        gc.collect()
    for schedule in SCHEDULES:
        engine = new_engine(_config(schedule, use_dynamic_bsz=True, max_token_len_per_micro_batch=48), model)
        results[(schedule, "mesh")] = engine.mesh
        steps = []
        for seed in SEEDS:
            steps.append(_step(engine, seed))
            if seed == SEEDS[1] and schedule == "1F1B":
                engine.save_checkpoint(out / "after_step_2")
        results[(schedule, "steps")] = steps
        results[(schedule, "weights")] = {name: tensor.clone() for name, tensor in engine.export_hf_weights()}
        if schedule == "1F1B":
            engine.save_hf(out / "export_pp2")
            results["trained_log_probs"] = _log_probs(engine, make_batch(seed=5))
        del engine
        gc.collect()
    engine = new_engine(_config("1F1B", use_dynamic_bsz=True, max_token_len_per_micro_batch=48), model)
    engine.load_checkpoint(out / "after_step_2")
    results["resumed_step_3"] = _step(engine, SEEDS[2])
    torch.save(results, out / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("titan_pp")
    return spawned_results(suite, 2, "tiny-llama", root), root


@pytest.fixture(scope="module")
def reference(ranks) -> dict[str, Any]:
    return reference_training(ranks[1] / "tiny-llama", [make_batch(seed) for seed in SEEDS])


def _hf_log_probs(model_path: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        return reference_token_stats(model, make_batch(seed=5))[0]


@pytest.mark.parametrize("remove_padding", [True, False])
def test_log_probs_match_transformers(ranks, remove_padding) -> None:
    results, root = ranks
    expected = _hf_log_probs(root / "tiny-llama")
    got = results[1][("log_probs", remove_padding)]  # the last stage collects
    assert results[0][("log_probs", remove_padding)].numel() == 0
    diff = (got - expected)[expected != 0].abs().max().item()
    assert diff <= ATOL, f"PP=2 log-probs vs transformers: {diff:.2e}"


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_only_the_last_stage_collects(ranks, schedule) -> None:
    meshes = [result[(schedule, "mesh")] for result in ranks[0]]
    assert [(m.dp_rank, m.dp_size, m.is_collect) for m in meshes] == [(0, 1, False), (0, 1, True)]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_training_matches_plain_pytorch(ranks, reference, schedule) -> None:
    results, _ = ranks
    for rank in (0, 1):  # the loss and grad norm on every stage
        losses, grad_norms = zip(*results[rank][(schedule, "steps")])
        assert losses == pytest.approx(reference["losses"], rel=RTOL)
        assert grad_norms == pytest.approx(reference["grad_norms"], rel=RTOL)
    for rank in (0, 1):  # every stage's weights on every rank
        weights = results[rank][(schedule, "weights")]
        assert set(weights) == set(reference["params"])
        diff = torch.stack([(weights[name] - p).norm() for name, p in reference["params"].items()]).norm()
        norm = torch.stack([p.norm() for p in reference["params"].values()]).norm()
        assert (diff / norm).item() <= RTOL, f"weights differ from plain PyTorch by {(diff / norm).item():.2e}"
        for name, expected in reference["params"].items():  # AdamW magnifies float noise where a gradient is ~0
            torch.testing.assert_close(weights[name], expected, atol=WEIGHT_ATOL, rtol=0,
                                       msg=lambda text: f"{name}: {text}")


def test_a_checkpoint_resumes_the_same_step(ranks) -> None:
    results, _ = ranks
    for rank in (0, 1):
        assert results[rank]["resumed_step_3"] == pytest.approx(results[rank][("1F1B", "steps")][2], rel=1e-6)


def test_save_hf_after_training_loads_in_transformers(ranks) -> None:
    results, root = ranks
    expected = _hf_log_probs(root / "export_pp2")
    diff = (results[1]["trained_log_probs"] - expected)[expected != 0].abs().max().item()
    assert diff <= ATOL, f"PP=2 trained log-probs vs the exported folder in transformers: {diff:.2e}"
    assert not torch.equal(results[1]["trained_log_probs"], results[1][("log_probs", True)]), "the steps must train"
