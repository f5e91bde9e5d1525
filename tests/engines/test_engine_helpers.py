"""In-process unit tests of the helpers any engine composes: optimizer step, offload bookkeeping,
checkpoint meta, the capability check of ``BaseEngine``, and the compiled decoder layer's shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import ddp_engine  # noqa: F401  (registers test_ddp)
from rlflow.engines import EngineConfigError, build_engine
from rlflow.engines.common.checkpoint import checkpointing as ckpt
from rlflow.engines.common.fsdp.layer_compile import compile_layer_forward
from rlflow.engines.common.optim.offload import HOST, HostOffload
from rlflow.engines.common.optim.optimizer_step import OptimizerStepper
from rlflow.engines.config import EngineConfig, LRSchedulerConfig, OptimizerConfig
from rlflow.errors import CheckpointError
from rlflow.utils.seed import set_seed

SCHEDULE = LRSchedulerConfig(name="linear", warmup_steps=0, total_steps=4, min_lr_ratio=0.0)  # 1, .75, .5, .25


def _stepper(grad_clip: float = 1.0) -> tuple[torch.nn.Linear, OptimizerStepper]:
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    config = EngineConfig(name="x", optimizer=OptimizerConfig(lr=0.1, grad_clip=grad_clip, weight_decay=0.0), lr_scheduler=SCHEDULE)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.0)

    def clip(max_norm: float) -> float:
        return torch.nn.utils.clip_grad_norm_(layer.parameters(), max_norm).item()

    return layer, OptimizerStepper(optimizer, config, clip)


def _backward(layer: torch.nn.Linear, scale: float = 1.0) -> None:
    (layer(torch.ones(4, 3)).sum() * scale).backward()


def test_stepper_skips_non_finite_counts_and_still_advances_the_schedule() -> None:
    layer, stepper = _stepper()
    before = [p.detach().clone() for p in layer.parameters()]
    _backward(layer, float("nan"))
    result = stepper.step()
    assert result["skipped"] and result["skipped_steps"] == 1 and result["lr"] == pytest.approx(0.1)
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters()))
    assert all(p.grad is None for p in layer.parameters())  # the poisoned gradients are dropped
    _backward(layer)
    result = stepper.step()
    assert not result["skipped"] and result["lr"] == pytest.approx(0.075)  # the schedule counted the skip
    assert not all(torch.equal(a, b) for a, b in zip(before, layer.parameters()))


def test_stepper_lr_override_lasts_one_step_and_clip_reports_the_unclipped_norm() -> None:
    layer, stepper = _stepper(grad_clip=0.5)
    _backward(layer)
    expected_norm = torch.cat([p.grad.flatten() for p in layer.parameters()]).norm().item()
    result = stepper.step(lr=0.0)
    assert result["lr"] == 0.0 and result["grad_norm"] == pytest.approx(expected_norm) and expected_norm > 0.5
    assert stepper.optimizer.param_groups[0]["lr"] == 0.0
    _backward(layer)
    assert stepper.step()["lr"] == pytest.approx(0.075)


def test_stepper_state_round_trips_through_the_checkpoint_meta(tmp_path: Path) -> None:
    _, stepper = _stepper()
    stepper.skipped_steps, stepper.schedule.step_count = 2, 3
    setup = ckpt.setup_meta("test_ddp", "causal_lm", 1, {"dp_replicate": 1})
    with ckpt.EngineCheckpointer(setup, stepper, 0, None).save(tmp_path / "c") as folder:
        (folder / "state.txt").write_text("model")
    _, fresh = _stepper()
    with ckpt.EngineCheckpointer(setup, fresh, 0, None).load(tmp_path / "c") as folder:
        assert (folder / "state.txt").read_text() == "model"
    assert (fresh.skipped_steps, fresh.schedule.step_count) == (2, 3)
    assert {"rng_rank0.pt", "engine_meta.json"} <= {p.name for p in (tmp_path / "c").iterdir()}
    other = ckpt.setup_meta("test_ddp", "causal_lm", 2, {"dp_replicate": 2})
    with pytest.raises(CheckpointError, match="world_size: checkpoint 1 vs this engine 2"):
        with ckpt.EngineCheckpointer(other, fresh, 0, None).load(tmp_path / "c"):
            pass


def test_rng_rule_when_the_world_size_changes(tmp_path: Path) -> None:
    """Rank r restores rng_rank{r}.pt when the checkpoint has it; a new rank reseeds from seed + r."""
    _, stepper = _stepper()
    setup = ckpt.setup_meta("fsdp2", "causal_lm", 1, {"dp_replicate": 1})
    set_seed(1234)
    with ckpt.EngineCheckpointer(setup, stepper, 0, None).save(tmp_path / "c"):
        pass
    saved_stream = torch.rand(3)  # what rank 0 draws after the save
    grown = {**setup, "world_size": 2}
    set_seed(7 + 1)
    expected_new_rank = torch.rand(3)
    for rank, expected in ((0, saved_stream), (1, expected_new_rank)):
        torch.manual_seed(99)  # whatever state the rank had before the load
        with ckpt.EngineCheckpointer(grown, stepper, rank, None, reshard=True, seed=7).load(tmp_path / "c"):
            pass
        assert torch.equal(torch.rand(3), expected), f"rank {rank}"
    with pytest.raises(CheckpointError, match="layout"):  # resharding frees the world size, nothing else
        with ckpt.EngineCheckpointer({**grown, "layout": {"dp_replicate": 2}}, stepper, 0, None, reshard=True).load(tmp_path / "c"):
            pass


def test_offload_follows_the_flags_and_brings_state_in_for_each_call() -> None:
    """Bookkeeping only: the move callbacks record where they were asked to put things."""
    device = torch.device("cuda", 0)  # a label here: nothing is allocated
    moves: list[tuple[str, torch.device]] = []
    config = EngineConfig(name="x", param_offload=True, optimizer_offload=False)
    offload = HostOffload(device, config, lambda d: moves.append(("params", d)), lambda d: moves.append(("optim", d)))
    assert moves == [("params", HOST)] and offload.params_on_host and not offload.optimizer_on_host
    moves.clear()
    with offload.resident():
        assert moves == [("params", device)]
    assert moves == [("params", device), ("params", HOST)]  # params back to the host, optimizer stays
    moves.clear()
    offload.offload()
    assert offload.params_on_host and offload.optimizer_on_host
    with offload.optimizer_resident():
        pass
    assert moves[-1] == ("optim", device) and offload.optimizer_on_host is False  # optimizer_offload is off
    offload.onload()
    assert not offload.params_on_host and not offload.optimizer_on_host


def test_capabilities_refuse_what_an_engine_cannot_do() -> None:
    with pytest.raises(EngineConfigError, match=r"'test_ddp' does not support mixed_precision \(param_dtype=bfloat16"):
        build_engine({"name": "test_ddp", "param_dtype": "bfloat16"}, "unused")
    build_engine({"name": "test_ddp", "param_dtype": "float32"}, "unused", model_kind="value")
    build_engine({"name": "fsdp2", "param_dtype": "bfloat16"}, "unused", model_kind="value")


def _decoder_layer(hidden_states, attention_mask, position_embeddings, position_ids):
    """A decoder layer's inputs as HF passes them with packed rows: mask [R, 1, W, W], cos/sin [R, W, D]."""
    cos, sin = position_embeddings
    scores = (hidden_states[..., : cos.shape[-1]] * cos + sin) @ hidden_states[..., : cos.shape[-1]].transpose(1, 2)
    weights = scores.masked_fill(~attention_mask[:, 0], -1e9).softmax(-1)
    return weights @ hidden_states + position_ids[..., None]


def _layer_inputs(rows: int, width: int, hidden: int = 16, head: int = 8) -> tuple:
    mask = torch.ones(width, width, dtype=torch.bool).tril().expand(rows, 1, width, width)
    cos_sin = (torch.randn(rows, width, head), torch.randn(rows, width, head))
    return torch.randn(rows, width, hidden), mask, cos_sin, torch.arange(width).expand(rows, width)


@pytest.mark.parametrize("token_dims_dynamic, compiles", [(True, 1), (False, 3)])
def test_a_compiled_layer_compiles_once_across_packed_row_shapes(token_dims_dynamic, compiles):
    """Rows change, then the width: one compile with the token grid marked dynamic, three without
    (dynamo's static graph, then one recompile per dimension); outputs equal the eager layer's."""
    torch._dynamo.reset()
    counter = CompileCounter()
    layer = compile_layer_forward(_decoder_layer, backend=counter) if token_dims_dynamic else torch.compile(
        _decoder_layer, backend=counter)
    for rows, width in [(6, 20), (7, 20), (5, 23), (4, 31)]:
        inputs = _layer_inputs(rows, width)
        torch.testing.assert_close(layer(*inputs), _decoder_layer(*inputs))
    assert counter.frame_count == compiles


def _grid_layer(hidden_states, sequence_slots):
    """A layer reading an index map of the layout, as sdpa_varlen's attention reads its ``[sequences, longest]`` grid."""
    return hidden_states[0][sequence_slots].sum(1).sum(0) + hidden_states.mean()


def test_a_compiled_layer_compiles_once_across_index_map_shapes():
    """The grid's sequence count and longest sequence change independently of the token count: marked too."""
    torch._dynamo.reset()
    counter = CompileCounter()
    layer = compile_layer_forward(_grid_layer, backend=counter)
    for tokens, sequences, longest in [(40, 5, 8), (45, 5, 9), (50, 6, 9), (33, 4, 11)]:
        inputs = (torch.randn(1, tokens, 16), torch.randint(0, tokens, (sequences, longest)))
        torch.testing.assert_close(layer(*inputs), _grid_layer(*inputs))
    assert counter.frame_count == 1
