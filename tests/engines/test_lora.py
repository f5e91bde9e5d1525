"""LoRA in the engines (issue 19): every engine declaring ``Capability.LORA``, at world size 1 and 2,
against a plain single-process ``peft`` + PyTorch loop written independently of the engines.

In spawned ranks each engine trains fresh adapters (rank 4) for 3 steps, then checkpoints, trains 3
more, reloads the checkpoint and trains the same 3 again. Checked here:

* only the adapters train and only they have optimizer state; the losses match the peft loop
  within 1e-4 relative, and the log-probs after training within 1e-5;
* ``adapters_disabled`` gives the base model's log-probs (the HF model without adapters);
* ``save_lora_adapter`` loads with ``PeftModel.from_pretrained`` (so does ``rlflow-export`` of the
  checkpoint), with ``save_hf`` with
  ``AutoModelForCausalLM`` (merged) and as a new engine's ``lora.adapter_path``, each with the
  engine's log-probs;
* the checkpoint holds the adapters, their Adam moments and step counters, and nothing of the
  base model; a resume repeats the 3 steps after it bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_testlib import (
    LR,
    OPTIMIZER,
    engine_config,
    engines_with,
    load_results,
    make_batch,
    new_engine,
    reference_model,
    reference_token_stats,
    save_results,
    spawn,
    train_steps,
)
from peft import LoraConfig, PeftModel, get_peft_model
from torch.distributed.checkpoint import FileSystemReader
from transformers import AutoModelForCausalLM

from rlflow.engines.base import Capability
from rlflow.engines.common.checkpoint.checkpointing import MODEL_OPTIM_DIR
from rlflow.trainer.export_checkpoint import export_checkpoint

LORA_ENGINES = engines_with(Capability.LORA)
LORA = {"rank": 4, "alpha": 8.0}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # all-linear of attention + mlp
SEED = 0
STEPS = 3
CONSTANT = {"name": "constant"}
pytestmark = pytest.mark.timeout(900)


def _batches(first_seed: int) -> list:
    return [make_batch(first_seed + i) for i in range(STEPS)]


def lora_scenario(rank: int, world_size: int, model_path: Path, out: Path) -> None:
    probe = make_batch(99)
    results: dict[str, Any] = {}
    for name in LORA_ENGINES:
        folder = out / f"{name}_ws{world_size}"
        engine = new_engine(engine_config(name, lora=dict(LORA), lr_scheduler=CONSTANT, seed=SEED), model_path)
        trainable = sorted(n for n, p in engine.module.named_parameters() if p.requires_grad)
        optimized = sum(len(group["params"]) for group in engine.optimizer.param_groups)
        first = train_steps(engine, _batches(0), rank, world_size)
        with torch.no_grad():
            trained = engine.forward_backward(probe, forward_only=True)[0].batch["log_probs"]
            with engine.adapters_disabled():
                disabled = engine.forward_backward(probe, forward_only=True)[0].batch["log_probs"]
        engine.save_checkpoint(folder / "ckpt")
        engine.save_lora_adapter(folder / "adapter")
        engine.save_hf(folder / "hf")
        after = train_steps(engine, _batches(10), rank, world_size)
        engine.load_checkpoint(folder / "ckpt")
        resumed = train_steps(engine, _batches(10), rank, world_size)
        started = new_engine(engine_config(name, lora={**LORA, "adapter_path": str(folder / "adapter")}), model_path)
        with torch.no_grad():
            from_adapter = started.forward_backward(probe, forward_only=True)[0].batch["log_probs"]
        results[name] = {"trainable": trainable, "optimized": optimized, "first": first, "after": after,
                         "resumed": resumed, "trained": trained, "disabled": disabled, "from_adapter": from_adapter}
    save_results(rank, out, f"lora_ws{world_size}.pt", results)


@pytest.fixture(scope="module", params=[1, 2], ids=["ws1", "ws2"])
def runs(request, model_path: Path, tmp_path_factory) -> tuple[int, Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp(f"lora_ws{request.param}")
    spawn(lora_scenario, request.param, model_path, out)
    return request.param, out, load_results(out, f"lora_ws{request.param}.pt")


@pytest.fixture(scope="module")
def peft_reference(model_path: Path) -> dict[str, Any]:
    """The plain loop: HF model + peft adapters drawn from the same seed, full batch, AdamW, clip."""
    torch.manual_seed(SEED)
    model = get_peft_model(reference_model(model_path), LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"],
                                                                   target_modules=TARGETS, lora_dropout=0.0))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=tuple(OPTIMIZER["betas"]), eps=OPTIMIZER["eps"],
                                  weight_decay=OPTIMIZER["weight_decay"])
    losses = []
    for batch in _batches(0):
        log_probs, _ = reference_token_stats(model, batch)
        mask = batch.batch["loss_mask"]
        loss = -(log_probs * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, OPTIMIZER["grad_clip"])
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        trained = reference_token_stats(model, make_batch(99))[0]
    return {"losses": losses, "trained": trained, "trainable": sum(p.numel() for p in params)}


def _probe_log_probs(model: torch.nn.Module) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return reference_token_stats(model, make_batch(99))[0]


def _defined(log_probs: torch.Tensor) -> torch.Tensor:
    mask = make_batch(99).batch["attention_mask"]
    defined = torch.zeros_like(log_probs)
    defined[:, 1:] = (mask[:, 1:] * mask[:, :-1]).float()
    return log_probs * defined


@pytest.mark.parametrize("engine", LORA_ENGINES)
def test_only_the_adapters_train_and_match_a_plain_peft_loop(runs, peft_reference, engine):
    world_size, _, results = runs
    result = results[engine]
    assert result["trainable"] and all(".lora_A." in n or ".lora_B." in n for n in result["trainable"])
    assert result["optimized"] == len(result["trainable"]), "the optimizer holds parameters that are not adapters"
    for step, (ours, ref) in enumerate(zip(result["first"]["losses"], peft_reference["losses"]), start=1):
        assert abs(ours - ref) / abs(ref) <= 1e-4, f"{engine} ws={world_size} step {step}: loss {ours} vs peft {ref}"
    assert result["first"]["losses"][-1] < result["first"]["losses"][0]
    torch.testing.assert_close(_defined(result["trained"]), peft_reference["trained"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("engine", LORA_ENGINES)
def test_disabled_adapters_give_the_base_model(runs, model_path, engine):
    _, _, results = runs
    base = _probe_log_probs(reference_model(model_path))
    torch.testing.assert_close(_defined(results[engine]["disabled"]), base, atol=1e-5, rtol=0)
    assert (_defined(results[engine]["trained"]) - base).abs().max() > 1e-3, "training left the adapters at zero"


@pytest.mark.parametrize("engine", LORA_ENGINES)
def test_peft_adapter_folder_and_merged_export_load_with_the_trained_weights(runs, model_path, engine):
    world_size, out, results = runs
    folder = out / f"{engine}_ws{world_size}"
    trained = _defined(results[engine]["trained"])
    peft_model = PeftModel.from_pretrained(reference_model(model_path), folder / "adapter")
    torch.testing.assert_close(_probe_log_probs(peft_model), trained, atol=1e-5, rtol=0)
    export_checkpoint(folder / "ckpt", folder / "exported")  # rlflow-export: the checkpoint's adapters as a peft folder
    exported = PeftModel.from_pretrained(reference_model(model_path), folder / "exported")
    torch.testing.assert_close(_probe_log_probs(exported), trained, atol=1e-5, rtol=0)
    torch.testing.assert_close(_defined(results[engine]["from_adapter"]), trained, atol=1e-6, rtol=0)  # lora.adapter_path
    merged = AutoModelForCausalLM.from_pretrained(folder / "hf", dtype=torch.float32)
    torch.testing.assert_close(_probe_log_probs(merged), trained, atol=1e-5, rtol=0)
    assert set(merged.state_dict()) == set(reference_model(model_path).state_dict()), "the merged export renamed weights"


@pytest.mark.parametrize("engine", LORA_ENGINES)
def test_checkpoint_holds_the_adapters_and_their_optimizer_state_and_resumes_bit_exactly(runs, model_path,
                                                                                          peft_reference, engine):
    world_size, out, results = runs
    result = results[engine]
    assert result["resumed"] == result["after"], f"{engine} ws={world_size}: resume diverged"
    state = FileSystemReader(str(out / f"{engine}_ws{world_size}" / "ckpt" / MODEL_OPTIM_DIR)).read_metadata()
    stored = {key: meta.size.numel() for key, meta in state.state_dict_metadata.items() if hasattr(meta, "size")}
    adapters, tensors = peft_reference["trainable"], len(result["trainable"])
    model_numel = sum(p.numel() for p in reference_model(model_path).parameters())
    print(f"{engine} ws={world_size}: checkpoint holds {sum(stored.values())} numbers; adapters {adapters}, model {model_numel}")
    # the adapters, Adam's two moments of each, and one step counter per adapter tensor: nothing of the base model
    assert sum(stored.values()) == 3 * adapters + tensors, sorted(stored)[:5]
    assert all(".lora_A." in key or ".lora_B." in key for key in stored)
