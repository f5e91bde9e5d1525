"""Ulysses sequence parallelism (``ulysses_sequence_parallel_size``, issue 44) on every engine that declares it.

Two gloo ranks run the same packed, dynamically batched micro-batches on ``tiny-qwen3`` (4 heads, 2 key/value
heads, q/k norms, tied embeddings) twice: at SP=1 (two data-parallel ranks, each half the batch) and at SP=2 (one
data-parallel rank: both ranks the whole batch, each a half of every micro-batch's stream, heads exchanged by
all-to-all). The loss, every gradient (after the engine's reduction), the log-probs, the entropy and a value
model's values must agree within 1e-5; the mesh must give both SP ranks one data-parallel rank. Removing the
gather's gradient factor (x2) or the exchange would break the gradients or the outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine_testlib import engine_config, full_grads, local_share, make_batch, new_engine, nll_token_mean, spawned_results
from rlflow.engines.base import Capability
from rlflow.engines.registry import engines_with
from rlflow.meta_info import COMPUTE_ENTROPY

SP_ENGINES = engines_with(Capability.SEQUENCE_PARALLEL)
TOLERANCE = 1e-5  # float32, the same sums in another order: measured below 1e-6
SIZES = (1, 2)


def _config(engine: str, size: int) -> dict[str, Any]:
    return engine_config(engine, attn_implementation="sdpa_varlen", use_dynamic_bsz=True,
                         max_token_len_per_micro_batch=40, ulysses_sequence_parallel_size=size)


def _run(engine_name: str, size: int, model: Path) -> dict[str, Any]:
    batch = make_batch(7, rows=8)
    batch.meta_info[COMPUTE_ENTROPY.name] = True
    engine = new_engine(_config(engine_name, size), model)
    mesh = engine.mesh
    outputs, metrics = engine.forward_backward(local_share(batch, mesh.dp_rank, mesh.dp_size), nll_token_mean)
    result = {"mesh": mesh, "loss": metrics["loss"], "grads": full_grads(engine),
              "log_probs": outputs.batch["log_probs"], "entropy": outputs.batch["entropy"]}
    critic = new_engine(_config(engine_name, size), model, kind="value")
    values, _ = critic.forward_backward(local_share(batch, mesh.dp_rank, mesh.dp_size), None, forward_only=True)
    result["values"] = values.batch["values"]
    return result


def suite(rank: int, world_size: int, model: Path, out: Path) -> None:
    results = {(engine, size): _run(engine, size, model) for engine in SP_ENGINES for size in SIZES}
    torch.save(results, out / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict[tuple[str, int], Any]]:
    return spawned_results(suite, 2, "tiny-qwen3", tmp_path_factory.mktemp("ulysses"))


def _whole(ranks: list[dict], engine: str, size: int, key: str) -> torch.Tensor:
    """The whole batch's per-token outputs: both data-parallel halves at SP=1, the first SP rank's at SP=2."""
    if size == 1:
        return torch.cat([ranks[0][(engine, 1)][key], ranks[1][(engine, 1)][key]])
    return ranks[0][(engine, size)][key]


def test_engines_declare_sequence_parallelism() -> None:
    assert {"fsdp", "fsdp2"} <= set(SP_ENGINES)


@pytest.mark.parametrize("engine", SP_ENGINES)
def test_sp_ranks_share_one_data_parallel_rank(ranks, engine) -> None:
    meshes = [result[(engine, 2)]["mesh"] for result in ranks]
    assert [(m.dp_rank, m.dp_size, m.is_collect) for m in meshes] == [(0, 1, True), (0, 1, False)]
    assert [ranks[r][(engine, 1)]["mesh"].dp_rank for r in (0, 1)] == [0, 1]


@pytest.mark.parametrize("engine", SP_ENGINES)
def test_loss_and_gradients_equal_sp1(ranks, engine) -> None:
    single, split = ranks[0][(engine, 1)], ranks[0][(engine, 2)]
    assert split["loss"] == pytest.approx(single["loss"], abs=TOLERANCE)
    assert ranks[1][(engine, 2)]["loss"] == split["loss"]
    assert set(split["grads"]) == set(single["grads"])
    for name, grad in single["grads"].items():
        assert grad.abs().max() > 0, name
        assert torch.allclose(split["grads"][name], grad, atol=TOLERANCE, rtol=0), name


@pytest.mark.parametrize("key", ["log_probs", "entropy", "values"])
@pytest.mark.parametrize("engine", SP_ENGINES)
def test_outputs_equal_sp1(ranks, engine, key) -> None:
    expected, got = _whole(ranks, engine, 1, key), _whole(ranks, engine, 2, key)
    assert expected.abs().max() > 0
    torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(ranks[1][(engine, 2)][key], got, atol=0, rtol=0)  # both SP ranks hold the whole
