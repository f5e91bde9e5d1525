"""The torchtitan engine's own acceptance points (the shared engine suites run it too: parity with plain
PyTorch, accumulation, checkpoints and resume, export, on the tiny Qwen2 preset).

* log-probs match ``transformers`` on the same weights (max abs diff <= 1e-4) for a Qwen3 preset
  (qk-norm, tied embeddings) and a Llama preset, packed and padded, and a packed batch equals each
  sequence run alone (the document masks come from ``position_ids``);
* ``save_hf`` after training loads into ``AutoModelForCausalLM`` with the engine's log-probs (tied:
  ``lm_head.weight`` is not written, as HF writes tied checkpoints);
* the first optimizer step runs at the warmup LR, not 0, and torchtitan's own schedule (0.3.0)
  indexes warmup from ``step + 1`` too;
* ``gradient_checkpointing`` recomputes each transformer block in backward (its forward runs twice);
* tensor parallelism (TP=2): log-probs match ``transformers``, only TP rank 0 collects, and
  ``save_hf`` after training loads with the engine's log-probs;
* what the engine cannot run fails at construction with one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine_testlib import engine_config, make_batch, new_engine, nll_token_mean, reference_token_stats, save_results, spawn
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.engines import EngineConfigError, build_engine
from rlflow.models.presets import build_preset

PRESETS = ("tiny-qwen3", "tiny-llama")
ATOL = 1e-4  # fp32, same weights, different kernels: measured differences are ~1e-6
LR = 1e-3
WARMUP = 4


def _log_probs(engine: Any, batch) -> torch.Tensor:
    batch.meta_info["temperature"] = 1.0
    outputs, _ = engine.forward_backward(batch, forward_only=True)
    return outputs.batch["log_probs"]


def _block_forward_calls(engine: Any, batch) -> int:
    """Forward calls of the first transformer block during one training forward + backward."""
    calls = [0]
    block = next(module for name, module in engine.module.named_modules() if name.endswith("attention_norm"))
    handle = block.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    engine.forward_backward(batch, nll_token_mean)
    handle.remove()
    engine.zero_grad()
    return calls[0]


def titan_suite(rank: int, world_size: int, models: dict[str, Path], out_dir: Path) -> None:
    results: dict[str, Any] = {}
    batch = make_batch(seed=5)
    for preset, folder in models.items():
        for remove_padding in (True, False):
            engine = new_engine(engine_config("torchtitan", use_remove_padding=remove_padding, micro_batch_size=8), folder)
            results[(preset, "rmpad" if remove_padding else "padded")] = _log_probs(engine, batch)
        rows = [batch[[row]] for row in range(len(batch))]
        results[(preset, "alone")] = torch.cat([_log_probs(engine, row) for row in rows])
    export_model = models["tiny-qwen3"]
    engine = new_engine(engine_config("torchtitan", micro_batch_size=4), export_model)
    for seed in (40, 41):
        engine.forward_backward(make_batch(seed), nll_token_mean)
        engine.optim_step()
    engine.save_hf(out_dir / "export")
    results["export_log_probs"] = _log_probs(engine, batch)
    schedule = {"name": "constant", "warmup_steps": WARMUP}
    engine = new_engine(engine_config("torchtitan", lr_scheduler=schedule, optimizer={"lr": LR}), export_model)
    engine.forward_backward(batch, nll_token_mean)
    results["first_lr"] = engine.optim_step()["lr"]
    for recompute in (False, True):
        engine = new_engine(engine_config("torchtitan", gradient_checkpointing=recompute, micro_batch_size=8), export_model)
        results[("block_forwards", recompute)] = _block_forward_calls(engine, batch)
    save_results(rank, out_dir, "titan.pt", results)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("titan_models")
    return {preset: build_preset(root / preset, tokenizer_corpus(), preset=preset, seed=0) for preset in PRESETS}


@pytest.fixture(scope="module")
def titan(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("titan")
    spawn(titan_suite, 1, models, out)
    return torch.load(out / "titan.pt", weights_only=False), out


@pytest.mark.parametrize("layout", ["rmpad", "padded"])
@pytest.mark.parametrize("preset", PRESETS)
def test_log_probs_match_transformers(preset: str, layout: str, models: dict[str, Path], titan) -> None:
    results, _ = titan
    batch = make_batch(seed=5)
    model = AutoModelForCausalLM.from_pretrained(models[preset], dtype=torch.float32)
    with torch.no_grad():
        expected, _ = reference_token_stats(model, batch)
    defined = expected != 0
    diff = (results[(preset, layout)] - expected)[defined].abs().max().item()
    assert diff <= ATOL, f"{preset} {layout}: max |log-prob difference| {diff:.2e} > {ATOL}"


@pytest.mark.parametrize("preset", PRESETS)
def test_packed_sequences_equal_each_sequence_alone(preset: str, titan) -> None:
    results, _ = titan
    diff = (results[(preset, "rmpad")] - results[(preset, "alone")]).abs().max().item()
    assert diff <= ATOL, f"{preset}: packed vs alone differ by {diff:.2e}"


def test_save_hf_after_training_loads_in_transformers(models: dict[str, Path], titan) -> None:
    results, out = titan
    folder = out / "export"
    assert not any("lm_head" in name for name in _saved_names(folder)), "tied lm_head.weight is written once, as embed_tokens"
    exported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    source = AutoModelForCausalLM.from_pretrained(models["tiny-qwen3"], dtype=torch.float32)
    assert exported.config.tie_word_embeddings and exported.lm_head.weight is exported.model.embed_tokens.weight
    moved = (exported.model.embed_tokens.weight - source.model.embed_tokens.weight).abs().max().item()
    assert moved > 1e-5, "the export must hold the trained weights, not the source folder's"
    batch = make_batch(seed=5)
    with torch.no_grad():
        expected, _ = reference_token_stats(exported, batch)
    diff = (results["export_log_probs"] - expected)[expected != 0].abs().max().item()
    assert diff <= ATOL, f"exported model's log-probs differ from the engine's by {diff:.2e}"


def _saved_names(folder: Path) -> list[str]:
    from safetensors import safe_open

    names = []
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle:
            names.extend(handle.keys())
    assert names, f"no safetensors in {folder}"
    return names


def test_first_step_runs_at_the_warmup_lr_not_zero(titan) -> None:
    results, _ = titan
    assert results["first_lr"] == pytest.approx(LR / WARMUP, rel=1e-9)


def test_torchtitans_own_warmup_indexes_from_step_plus_one() -> None:
    """Pins torchtitan 0.3.0: its first step's LR is lr / warmup_steps too (verl hit a version where it was 0)."""
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    LRSchedulersContainer.Config(warmup_steps=WARMUP).build(optimizers=[optimizer], training_steps=10)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(LR / WARMUP, rel=1e-9)


def test_gradient_checkpointing_recomputes_each_block_in_backward(titan) -> None:
    results, _ = titan
    assert results[("block_forwards", False)] == 1
    assert results[("block_forwards", True)] == 2


def test_what_the_engine_cannot_run_fails_in_one_line(models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="param_dtype"):
        build_engine({"name": "torchtitan", "param_dtype": "float16"}, models["tiny-llama"])
    with pytest.raises(EngineConfigError, match="does not support value_model"):
        build_engine({"name": "torchtitan"}, models["tiny-llama"], model_kind="value")
    config = (models["tiny-llama"] / "config.json").read_text().replace('"llama"', '"gpt_neox"')
    (tmp_path / "other").mkdir()
    for file in models["tiny-llama"].iterdir():
        (tmp_path / "other" / file.name).write_bytes(file.read_bytes())
    (tmp_path / "other" / "config.json").write_text(config)
    with pytest.raises(EngineConfigError, match="torchtitan model family") as error:
        build_engine({"name": "torchtitan"}, tmp_path / "other")
    assert "\n" not in str(error.value)
    (tmp_path / "other" / "config.json").write_text((models["tiny-llama"] / "config.json").read_text().replace('"silu"', '"gelu"'))
    with pytest.raises(EngineConfigError, match="hidden_act='gelu'"):
        build_engine({"name": "torchtitan"}, tmp_path / "other")
    with pytest.raises(EngineConfigError, match="tensor_parallel_size=1 for a checkpoint with tie_word_embeddings"):
        build_engine({"name": "torchtitan", "tensor_parallel_size": 2}, models["tiny-qwen3"])


def test_the_cpu_mask_is_torchtitans_packed_document_mask(models: dict[str, Path]) -> None:
    """cpu_compat's dense mask equals torchtitan's own BlockMask (evaluated densely) on packed and padded rows."""
    from torch.nn.attention.flex_attention import create_mask
    from torchtitan.models.common.attention import FlexAttention
    from transformers import AutoConfig

    from rlflow.engines.torchtitan.architectures import titan_architecture
    from rlflow.engines.common.batching.packing import document_causal_mask

    hf_config = AutoConfig.from_pretrained(models["tiny-qwen3"])
    with torch.device("meta"):  # torchtitan's model as it runs on GPU: flex attention
        model = titan_architecture(hf_config).model_config(hf_config, FlexAttention.Config).build()
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 0, 1], [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 6, 6]])
    block_mask = model.get_attention_masks(positions)  # meta model: the mask needs only the config
    expected = create_mask(block_mask.mask_mod, 2, None, 12, 12, device="cpu")
    assert torch.equal(document_causal_mask(positions), expected)


def tensor_parallel_suite(rank: int, world_size: int, model: Path, out_dir: Path) -> None:
    """TP=2 on 2 ranks (one data-parallel group): log-probs, the mesh each rank reports, then train and save_hf."""
    engine = new_engine(engine_config("torchtitan", tensor_parallel_size=2, micro_batch_size=8), model)
    results: dict[str, Any] = {"mesh": engine.mesh, "log_probs": _log_probs(engine, make_batch(seed=5))}
    for seed in (40, 41):
        engine.forward_backward(make_batch(seed), nll_token_mean)
        engine.optim_step()
    engine.save_hf(out_dir / "export_tp2")
    results["trained_log_probs"] = _log_probs(engine, make_batch(seed=5))
    torch.save(results, out_dir / f"tp_rank{rank}.pt")


def test_tensor_parallel_matches_transformers_and_exports(tmp_path: Path) -> None:
    # Qwen3 (its q/k norms are replicated across the TP ranks while the heads are sharded), untied: TP refuses tied
    untied = build_preset(tmp_path / "qwen3-untied", tokenizer_corpus(), preset="tiny-qwen3", seed=0, tie_word_embeddings=False)
    spawn(tensor_parallel_suite, 2, untied, tmp_path)
    ranks = [torch.load(tmp_path / f"tp_rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    assert [(r["mesh"].dp_rank, r["mesh"].dp_size, r["mesh"].is_collect) for r in ranks] == [(0, 1, True), (0, 1, False)]
    batch = make_batch(seed=5)
    for model_path, key in ((untied, "log_probs"), (tmp_path / "export_tp2", "trained_log_probs")):
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        with torch.no_grad():
            expected, _ = reference_token_stats(model, batch)
        diff = (ranks[0][key] - expected)[expected != 0].abs().max().item()
        assert diff <= ATOL, f"TP=2 {key} vs transformers ({model_path.name}): {diff:.2e}"
    assert not torch.equal(ranks[0]["log_probs"], ranks[0]["trained_log_probs"]), "the TP steps must train"
