"""The megatron engine's distributed optimizer (``use_distributed_optimizer``) at data parallel size 2 (issue 44).

Two gloo ranks (TP = PP = 1, DP = 2) train the ``tiny-qwen2`` preset for 3 steps twice, without and with the
distributed optimizer, on the same data: the losses and gradient norms agree within 1e-6 and the weights within
1e-5, and each rank's AdamW state (the moments' bytes) is half of what it is without it. A fresh engine that loads the sharded
run's checkpoint after step 2 takes the same step 3 (each rank's share of the moments saved and restored).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_testlib import engine_config, local_share, make_batch, new_engine, nll_token_mean, spawned_results

TOLERANCE = 1e-6  # the bound on the losses; also a resumed step against the sharded run's own
# Weights after 3 steps at lr 1e-2, measured 5.4e-6 apart: AdamW's vector kernels round a share that starts
# mid-vector differently in the last bit, and Adam's normalisation turns that into visible steps where a
# gradient is about 0 (docs/platform.md, Qwen2's key biases).
WEIGHTS_TOLERANCE = 1e-5
SEEDS = (40, 41, 42)


def _config(sharded: bool) -> dict[str, Any]:
    return engine_config("megatron", micro_batch_size=4, use_distributed_optimizer=sharded, optimizer={"lr": 1e-2})


def _step(engine: Any, seed: int) -> tuple[float, float]:
    """The step's loss and gradient norm."""
    batch = local_share(make_batch(seed), engine.mesh.dp_rank, engine.mesh.dp_size)
    _, metrics = engine.forward_backward(batch, nll_token_mean)
    return metrics["loss"], engine.optim_step()["grad_norm"]


def _state_bytes(engine: Any) -> int:
    return sum(value.numel() * value.element_size() for slots in engine.optimizer.state.values()
               for key, value in slots.items() if key != "step")


def suite(rank: int, world_size: int, model: Path, out: Path) -> None:
    results: dict[Any, Any] = {}
    for sharded in (False, True):
        engine = new_engine(_config(sharded), model)
        losses = []  # each step's loss and gradient norm
        for seed in SEEDS:
            losses.extend(_step(engine, seed))
            if sharded and seed == SEEDS[1]:
                engine.save_checkpoint(out / "after_step_2")
        results[sharded] = (losses, _state_bytes(engine), {n: t.clone() for n, t in engine.export_hf_weights()})
        del engine
        gc.collect()
    engine = new_engine(_config(True), model)
    engine.load_checkpoint(out / "after_step_2")
    results["resumed"] = (list(_step(engine, SEEDS[2])), {n: t.clone() for n, t in engine.export_hf_weights()})
    torch.save(results, out / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict[Any, Any]]:
    return spawned_results(suite, 2, "tiny-qwen2", tmp_path_factory.mktemp("distributed_optimizer"))


def _max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys()
    return max(float((first[name] - second[name]).abs().max()) for name in first)


def test_sharded_state_trains_as_the_whole_state_does_with_half_the_memory(runs):
    for rank, results in enumerate(runs):
        (plain_losses, plain_bytes, plain_weights), (losses, sharded_bytes, weights) = results[False], results[True]
        print(f"rank {rank}: AdamW state {plain_bytes} bytes whole, {sharded_bytes} sharded; losses {losses}")
        assert losses == pytest.approx(plain_losses, abs=TOLERANCE)  # each step's loss and gradient norm
        assert _max_difference(weights, plain_weights) <= WEIGHTS_TOLERANCE
        assert plain_weights.keys() and _max_difference(weights, runs[0][True][2]) == 0.0  # every rank gathered alike
        assert sharded_bytes <= plain_bytes / 2 + 4 * 64  # half, plus at most a padding element per parameter
    assert sum(results[True][1] for results in runs) >= runs[0][False][1]  # the shares cover the whole state


def test_a_checkpoint_of_the_sharded_state_resumes_the_same_step(runs):
    for results in runs:
        loss, weights = results["resumed"]
        assert loss == pytest.approx(results[True][0][4:], abs=TOLERANCE)  # step 3's loss and gradient norm
        assert _max_difference(weights, results[True][2]) <= TOLERANCE
