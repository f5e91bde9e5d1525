"""The megatron engine in bf16 with fp32 master weights (``param_dtype=bfloat16``, ``dtype=float32``; issue 44).

Two gloo ranks (DP = 2, the distributed optimizer on, so the masters are sharded too) train the ``tiny-qwen2``
preset 3 steps at lr 1e-6, an update far below bf16's resolution of these weights:

* with fp32 masters, every master moves, each bf16 parameter equals its master rounded to bf16, the losses
  stay within bf16's error of the fp32 run's, and the export is the fp32 masters (near the fp32 run's weights);
* all in bf16 (``dtype=param_dtype=bfloat16``, no masters) the same updates round away: next to no weight moves;
* a fresh engine that loads the mixed run's checkpoint after step 2 takes the same step 3 (the masters restored).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_testlib import engine_config, local_share, make_batch, new_engine, nll_token_mean, spawned_results
from rlflow.engines.megatron.model import megatron_names

SEEDS = (40, 41, 42)
BF16_LOSS = 5e-3  # bf16 activations against fp32: measured 2e-4 on these losses
DTYPES = {"fp32": ("float32", "float32"), "mixed": ("float32", "bfloat16"), "bf16": ("bfloat16", "bfloat16")}


def _config(name: str) -> dict[str, Any]:
    dtype, param_dtype = DTYPES[name]
    return engine_config("megatron", micro_batch_size=4, dtype=dtype, param_dtype=param_dtype,
                         use_distributed_optimizer=True, optimizer={"lr": 1e-6})


def _step(engine: Any, seed: int) -> float:
    _, metrics = engine.forward_backward(local_share(make_batch(seed), engine.mesh.dp_rank, engine.mesh.dp_size),
                                         nll_token_mean)
    engine.optim_step()
    return metrics["loss"]


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in megatron_names(engine.stage)}


def suite(rank: int, world_size: int, model: Path, out: Path) -> None:
    results: dict[str, Any] = {}
    for name in DTYPES:
        engine = new_engine(_config(name), model)
        before = _weights(engine)
        masters_before = {k: v.clone() for k, v in engine.shares.named_masters().items()}
        losses = []
        for seed in SEEDS:
            losses.append(_step(engine, seed))
            if name == "mixed" and seed == SEEDS[1]:
                engine.save_checkpoint(out / "mixed_after_step_2")
        shares = [(share.elements().clone(), share.param.detach().clone()) for share in engine.shares.shares]
        exported = dict(engine.export_hf_weights())
        results[name] = {"losses": losses, "before": before, "after": _weights(engine), "shares": shares,
                         "exported": {key: value.clone() for key, value in exported.items()},
                         "masters_before": masters_before, "masters": engine.shares.named_masters()}
        del engine
        gc.collect()
    engine = new_engine(_config("mixed"), model)
    engine.load_checkpoint(out / "mixed_after_step_2")
    results["resumed"] = (_step(engine, SEEDS[2]), _weights(engine))
    torch.save(results, out / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict[str, Any]]:
    return spawned_results(suite, 2, "tiny-qwen2", tmp_path_factory.mktemp("mixed_precision"))


def _moved_share(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """The share of all elements whose value changed."""
    changed = sum(int((after[k] != before[k]).sum()) for k in before)
    return changed / sum(tensor.numel() for tensor in before.values())


def test_fp32_masters_keep_updates_that_bf16_rounds_away(runs):
    for results in runs:
        mixed, bf16 = results["mixed"], results["bf16"]
        assert mixed["losses"] == pytest.approx(results["fp32"]["losses"], abs=BF16_LOSS)
        assert all(torch.equal(elements, master.to(torch.bfloat16)) for elements, master in mixed["shares"])
        kept_masters = _moved_share(mixed["masters_before"], mixed["masters"])
        kept_bf16 = _moved_share(bf16["before"], bf16["after"])
        print(f"elements an update moved: fp32 masters {kept_masters:.3f}, all-bf16 weights {kept_bf16:.3f}")
        assert kept_masters > 0.9 and kept_bf16 < 0.1, (kept_masters, kept_bf16)
        assert not bf16["masters"]  # no masters when the weights are the compute dtype
        # the export is the fp32 masters, gathered from both ranks' shares
        assert {tensor.dtype for tensor in mixed["exported"].values()} == {torch.float32}
        assert all(float((mixed["exported"][k] - results["fp32"]["exported"][k]).abs().max()) < 1e-4
                   for k in mixed["exported"])


def test_a_checkpoint_of_the_masters_resumes_the_same_step(runs):
    for results in runs:
        loss, weights = results["resumed"]
        assert loss == pytest.approx(results["mixed"]["losses"][2], abs=1e-6)
        assert all(torch.equal(weights[k], results["mixed"]["after"][k]) for k in weights)
