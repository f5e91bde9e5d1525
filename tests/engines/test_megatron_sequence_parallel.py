"""The megatron engine with ``sequence_parallel`` at TP=2 (issue 44), against the same engine without it.

Two gloo ranks, one tensor-parallel group, ``tiny-qwen3`` (q/k norms, tied embeddings): the embeddings scatter
the sequence over the TP ranks, every norm runs on a slice of it, each layer's column-parallel input gathers it
and its row-parallel output reduce-scatters it, and the last stage gathers the final hidden states. Packed rows of
odd widths are widened to a multiple of TP. Against ``sequence_parallel=false`` on the same batches:

* log-probs and entropy, and a value model's values, within 1e-5;
* three optimizer steps: the losses and grad norms within 1e-5 (relative), every exported weight within 1e-5.
  The norms' gradients are partial sums on each rank until ``finalize_model_grads`` adds them over TP (their
  ``sequence_parallel`` mark, ``norm.py``): without the mark the norm weights, the grad norm and the losses of
  later steps would differ.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_testlib import engine_config, make_batch, new_engine, nll_token_mean, spawned_results
from rlflow.meta_info import COMPUTE_ENTROPY

TOLERANCE = 1e-5  # float32, the same sums in another order
SEEDS = (40, 41, 42)


def _config(sequence_parallel: bool) -> dict[str, Any]:
    return engine_config("megatron", tensor_model_parallel_size=2, micro_batch_size=3,
                         sequence_parallel=sequence_parallel)


def _run(sequence_parallel: bool, model: Path) -> dict[str, Any]:
    batch = make_batch(5)
    batch.meta_info[COMPUTE_ENTROPY.name] = True
    critic = new_engine(_config(sequence_parallel), model, kind="value")
    values = critic.forward_backward(batch, forward_only=True)[0].batch.get("values")  # on TP rank 0
    del critic
    gc.collect()
    engine = new_engine(_config(sequence_parallel), model)
    outputs = engine.forward_backward(batch, forward_only=True)[0]
    steps = []
    for seed in SEEDS:
        _, metrics = engine.forward_backward(make_batch(seed), nll_token_mean)
        steps.append((metrics["loss"], engine.optim_step()["grad_norm"]))
    weights = {name: tensor.clone() for name, tensor in engine.export_hf_weights()}
    return {"values": values, "log_probs": outputs.batch.get("log_probs"), "entropy": outputs.batch.get("entropy"),
            "steps": steps, "weights": weights}


def suite(rank: int, world_size: int, model: Path, out: Path) -> None:
    torch.save({flag: _run(flag, model) for flag in (False, True)}, out / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[bool, dict[str, Any]]:
    return spawned_results(suite, 2, "tiny-qwen3", tmp_path_factory.mktemp("megatron_sp"))[0]  # TP rank 0 collects


@pytest.mark.parametrize("key", ["log_probs", "entropy", "values"])
def test_outputs_equal_without_sequence_parallelism(runs, key) -> None:
    assert runs[False][key].abs().max() > 0
    torch.testing.assert_close(runs[True][key], runs[False][key], atol=TOLERANCE, rtol=0)


def test_training_equals_without_sequence_parallelism(runs) -> None:
    plain, split = runs[False], runs[True]
    assert [loss for loss, _ in split["steps"]] == pytest.approx([loss for loss, _ in plain["steps"]], rel=TOLERANCE)
    assert [norm for _, norm in split["steps"]] == pytest.approx([norm for _, norm in plain["steps"]], rel=TOLERANCE)
    assert plain["steps"][2][0] != plain["steps"][0][0], "the steps must train"
    assert set(split["weights"]) == set(plain["weights"])
    for name, expected in plain["weights"].items():
        torch.testing.assert_close(split["weights"][name], expected, atol=TOLERANCE, rtol=0,
                                   msg=lambda text: f"{name}: {text}")
