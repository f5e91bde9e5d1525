"""The megatron engine's own acceptance points (the shared engine suites run it too, at TP = PP = 1 with data
parallelism: parity with plain PyTorch, accumulation, value model, checkpoints, export).

* **Layout matrix.** Log-probs match ``transformers`` on the same weights (max abs diff <= 1e-4) at
  TP=1, TP=2, PP=2 and TP=2 x PP=2 on 4 ranks for a Qwen2 preset (GQA, q/k/v biases, tied
  embeddings), and at TP=1 and TP=2 x PP=2 for a Llama and a Qwen3 preset (q/k norms); packed and
  padded rows; a packed batch equals each sequence run alone;
* only TP rank 0 of the last pipeline stage collects, one per data-parallel group;
* a value model (a fresh score head on a Llama folder) at TP=2 x PP=2 gives transformers' values;
* **Export.** ``save_hf`` after training at TP=2 x PP=2 loads into ``AutoModelForCausalLM`` with the
  engine's log-probs, and ``export_hf_weights`` is what loads;
* **Resume.** At TP=2 the 3 steps after a checkpoint give bit-identical losses, grad norms and weights
  whether or not the run was restarted from it;
* ``gradient_checkpointing`` recomputes each transformer layer in backward (its forward runs twice);
* what the engine cannot run fails at construction with one line.
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
    position_ids_of,
    reference_token_stats,
    spawn,
)
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.engines import EngineConfigError, build_engine
from rlflow.models.presets import build_preset
from rlflow.models.value_models import load_value_model

ATOL = 1e-4  # fp32, same weights, different kernels and reduction orders: measured differences are ~1e-6
LAYOUTS = {"tiny-qwen2": [(1, 1), (2, 1), (1, 2), (2, 2)], "tiny-llama": [(1, 1), (2, 2)], "tiny-qwen3": [(1, 1), (2, 2)]}


def _config(tp: int, pp: int, **overrides: Any) -> dict[str, Any]:
    return engine_config("megatron", tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, **overrides)


def _log_probs(engine: Any, batch) -> torch.Tensor | None:
    batch.meta_info["temperature"] = 1.0
    outputs, _ = engine.forward_backward(batch, forward_only=True)
    return outputs.batch["log_probs"] if engine.mesh.is_collect and engine.mesh.dp_rank == 0 else None


def layout_suite(rank: int, world_size: int, models: dict[str, Path], out_dir: Path) -> None:
    """Every preset and layout on 4 ranks (each data-parallel group runs the whole batch); then train and export."""
    results: dict[Any, Any] = {}
    batch = make_batch(seed=5)
    for preset, layouts in LAYOUTS.items():
        for tp, pp in layouts:
            for packed in (True, False):
                engine = new_engine(_config(tp, pp, use_remove_padding=packed, micro_batch_size=3), models[preset])
                results[(preset, tp, pp, packed)] = _log_probs(engine, batch)
                results[("mesh", preset, tp, pp)] = engine.mesh
            if (tp, pp) == (2, 2):
                rows = [_log_probs(engine, batch[[row]]) for row in range(len(batch))]
                results[(preset, "alone")] = torch.cat(rows) if rows[0] is not None else None
            del engine
            gc.collect()
    critic = new_engine(_config(2, 2, micro_batch_size=3), models["tiny-llama"], kind="value")
    values, _ = critic.forward_backward(batch, forward_only=True)
    results["values"] = values.batch["values"] if critic.mesh.is_collect else None
    del critic
    gc.collect()
    engine = new_engine(_config(2, 2, micro_batch_size=4), models["tiny-qwen2"])
    for seed in (40, 41):
        engine.forward_backward(make_batch(seed), nll_token_mean)
        engine.optim_step()
    engine.save_hf(out_dir / "export_tp2_pp2")
    results["exported"] = {name: tensor.clone() for name, tensor in engine.export_hf_weights()}
    results["trained_log_probs"] = _log_probs(engine, batch)
    torch.save(results, out_dir / f"layouts_rank{rank}.pt")


def _train(engine: Any, seeds: list[int]) -> dict[str, list[float]]:
    record: dict[str, list[float]] = {"losses": [], "grad_norms": []}
    for seed in seeds:
        _, metrics = engine.forward_backward(make_batch(seed), nll_token_mean)
        record["losses"].append(metrics["loss"])
        record["grad_norms"].append(engine.optim_step()["grad_norm"])
    return record


def resume_suite(rank: int, world_size: int, model: Path, out_dir: Path) -> None:
    """TP=2: 2 steps, checkpoint, 3 more; a fresh engine loads the checkpoint and runs the same 3. Then the
    layer forwards of one training pass with and without gradient checkpointing, and the parameters and
    grad buffers parked in host memory with gradients pending (what ``param_offload`` does on a GPU)."""
    config = _config(2, 1, micro_batch_size=2, lr_scheduler={"name": "cosine", "warmup_steps": 1, "total_steps": 6})
    engine = new_engine(config, model)
    _train(engine, [60, 61])
    engine.save_checkpoint(out_dir / "ckpt")
    straight = _train(engine, [62, 63, 64])
    straight["weights"] = {name: tensor.clone() for name, tensor in engine.export_hf_weights()}
    del engine
    gc.collect()
    resumed_engine = new_engine(config, model)
    resumed_engine.load_checkpoint(out_dir / "ckpt")
    resumed = _train(resumed_engine, [62, 63, 64])
    resumed["weights"] = {name: tensor.clone() for name, tensor in resumed_engine.export_hf_weights()}
    del resumed_engine
    gc.collect()
    forwards = {}
    for recompute in (False, True):
        engine = new_engine(_config(2, 1, gradient_checkpointing=recompute, micro_batch_size=8), model)
        layer = engine.stage.module.decoder.layers[0].self_attention
        calls = [0]
        handle = layer.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        engine.forward_backward(make_batch(5), nll_token_mean)
        handle.remove()
        forwards[recompute] = calls[0]
        if recompute:
            pending = [param.main_grad.clone() for param in engine.optimizer.params]
            weights = [param.detach().clone() for param in engine.stage.parameters()]
            engine.parking.park()
            parked_bytes = [tensor.untyped_storage().nbytes() for tensor in engine.parking.tensors]
            engine.parking.restore()
            parking = {"parked_bytes": parked_bytes, "pending": [float(grad.abs().sum()) for grad in pending],
                       "kept_grads": all(torch.equal(param.main_grad, grad)
                                         for param, grad in zip(engine.optimizer.params, pending)),
                       "kept_weights": all(torch.equal(param, weight)
                                           for param, weight in zip(engine.stage.parameters(), weights))}
        del engine
        gc.collect()
    if rank == 0:
        torch.save({"straight": straight, "resumed": resumed, "forwards": forwards, "parking": parking},
                   out_dir / "resume.pt")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("megatron_models")
    return {preset: build_preset(root / preset, tokenizer_corpus(), preset=preset, seed=0) for preset in LAYOUTS}


@pytest.fixture(scope="module")
def layouts(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[Any, Any], Path]:
    out = tmp_path_factory.mktemp("megatron_layouts")
    spawn(layout_suite, 4, models, out)
    merged: dict[Any, Any] = {}  # outputs from the rank that has them (the collect rank of DP group 0); meshes by rank
    for rank in range(4):
        for key, value in torch.load(out / f"layouts_rank{rank}.pt", weights_only=False).items():
            if isinstance(key, tuple) and key[0] == "mesh":
                merged.setdefault(key, {})[rank] = value
            elif value is not None:
                merged[key] = value
    return merged, out


def _expected(folder: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        expected, _ = reference_token_stats(model, make_batch(seed=5))
    return expected


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("preset,tp,pp", [(p, tp, pp) for p, layouts in LAYOUTS.items() for tp, pp in layouts])
def test_log_probs_match_transformers(preset: str, tp: int, pp: int, packed: bool, models, layouts) -> None:
    results, _ = layouts
    expected = _expected(models[preset])
    diff = (results[(preset, tp, pp, packed)] - expected)[expected != 0].abs().max().item()
    assert diff <= ATOL, f"{preset} TP={tp} PP={pp} packed={packed}: max |log-prob difference| {diff:.2e} > {ATOL}"


@pytest.mark.parametrize("preset", list(LAYOUTS))
def test_packed_sequences_equal_each_sequence_alone(preset: str, layouts) -> None:
    results, _ = layouts
    diff = (results[(preset, 2, 2, True)] - results[(preset, "alone")]).abs().max().item()
    assert diff <= ATOL, f"{preset} TP=2 x PP=2: packed vs alone differ by {diff:.2e}"


def test_only_tp_rank_0_of_the_last_stage_collects(layouts) -> None:
    results, _ = layouts
    meshes = {(tp, pp): results[("mesh", "tiny-qwen2", tp, pp)] for tp, pp in LAYOUTS["tiny-qwen2"]}
    as_tuples = {layout: [(m.dp_rank, m.dp_size, m.is_collect) for _, m in sorted(by_rank.items())]
                 for layout, by_rank in meshes.items()}
    assert as_tuples[(1, 1)] == [(r, 4, True) for r in range(4)]
    assert as_tuples[(2, 1)] == [(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)]
    assert as_tuples[(1, 2)] == [(0, 2, False), (1, 2, False), (0, 2, True), (1, 2, True)]
    assert as_tuples[(2, 2)] == [(0, 1, False), (0, 1, False), (0, 1, True), (0, 1, False)]


def test_a_value_model_at_tp2_pp2_matches_transformers(models, layouts) -> None:
    """A critic started from a causal-LM folder: the engine's seeded fresh head, as rlflow's loader draws it."""
    results, _ = layouts
    batch = make_batch(seed=5)
    torch.manual_seed(0)  # the engine's seed: both draw the same fresh score head
    model = load_value_model(models["tiny-llama"])
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    with torch.no_grad():
        hidden = model.model(ids, attention_mask=mask, position_ids=position_ids_of(mask)).last_hidden_state
        expected = model.score(hidden).squeeze(-1) * mask
    diff = (results["values"] * mask - expected).abs().max().item()
    assert diff <= ATOL, f"TP=2 x PP=2 values differ from transformers' by {diff:.2e}"


def test_export_from_tp2_pp2_loads_in_transformers(models, layouts) -> None:
    results, out = layouts
    folder = out / "export_tp2_pp2"
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert loaded.config.tie_word_embeddings and loaded.lm_head.weight is loaded.model.embed_tokens.weight
    state = loaded.state_dict()
    assert set(results["exported"]) == set(state) - {"lm_head.weight"}, "the export is every HF weight, tied ones once"
    assert all(torch.equal(state[name], tensor) for name, tensor in results["exported"].items())
    source = AutoModelForCausalLM.from_pretrained(models["tiny-qwen2"], dtype=torch.float32)
    moved = (loaded.model.layers[3].mlp.up_proj.weight - source.model.layers[3].mlp.up_proj.weight).abs().max().item()
    assert moved > 1e-5, "the export must hold the trained weights, not the source folder's"
    expected = _expected(folder)
    diff = (results["trained_log_probs"] - expected)[expected != 0].abs().max().item()
    assert diff <= ATOL, f"exported model's log-probs differ from the engine's by {diff:.2e}"


@pytest.fixture(scope="module")
def resume(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("megatron_resume")
    spawn(resume_suite, 2, models["tiny-qwen2"], out)
    return torch.load(out / "resume.pt", weights_only=False)


def test_resume_at_tp2_is_bit_exact_for_three_steps(resume) -> None:
    straight, resumed = resume["straight"], resume["resumed"]
    assert resumed["losses"] == straight["losses"] and resumed["grad_norms"] == straight["grad_norms"]
    assert all(torch.equal(resumed["weights"][name], tensor) for name, tensor in straight["weights"].items())


def test_gradient_checkpointing_recomputes_each_layer_in_backward(resume) -> None:
    assert resume["forwards"] == {False: 1, True: 2}


def test_parking_frees_the_storage_and_keeps_weights_and_pending_gradients(resume) -> None:
    parking = resume["parking"]
    assert parking["parked_bytes"] and set(parking["parked_bytes"]) == {0}
    assert sum(parking["pending"]) > 0 and parking["kept_grads"] and parking["kept_weights"]


def test_what_the_engine_cannot_run_fails_in_one_line(models: dict[str, Path]) -> None:
    qwen2 = models["tiny-qwen2"]  # 4 layers, 4 heads, 2 KV heads
    cases = {
        "pipeline_model_parallel_size=5 is more stages than num_hidden_layers=4": {"pipeline_model_parallel_size": 5},
        "tensor_model_parallel_size=4 must divide num_key_value_heads=2": {"tensor_model_parallel_size": 4},
        "does not support lora": {"lora": {"rank": 4}},
    }
    for message, overrides in cases.items():
        with pytest.raises(EngineConfigError, match=message) as error:
            build_engine({"name": "megatron", **overrides}, qwen2)
        assert "\n" not in str(error.value)


def test_importing_the_engine_leaves_torchs_weights_only_allowlist_alone() -> None:
    """megatron-core's import adds numpy arrays and more to ``torch.load(weights_only=True)``'s allowlist; the engine
    package takes them out again (rlflow's state files must keep refusing pickled numpy state: test_security_files)."""
    import numpy as np
    from megatron.core.safe_globals import SAFE_GLOBALS  # megatron-core first: it registers them on import

    import rlflow.engines.megatron  # noqa: F401

    allowed = torch.serialization.get_safe_globals()
    assert np.ndarray not in allowed and not any(entry in allowed for entry in SAFE_GLOBALS)
