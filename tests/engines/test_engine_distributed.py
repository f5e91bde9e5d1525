"""Engine acceptance tests in real processes over gloo: parity with plain PyTorch, gradient
accumulation, packing, HF export and the value-head engine (checkpoints: test_engine_checkpoints.py).

Every registered engine runs them (``engine_scenarios.ENGINES``: the built-in ones, megatron a
``DelegatingEngine`` and the others ``ModuleEngine``s, and ``test_ddp``, the DDP engine of
docs/engines.md on ``ModuleEngine``); a scenario that needs an optional
feature is parametrized over the engines that declare it (``engines_with``).
Three launches in total (one of 2 ranks, two of 1 rank: the session fixtures in conftest.py);
each runs many configurations and rank 0 saves the results that the tests below check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine_scenarios import FSDP2_REDUCE_EVERY_MICRO, parity_configs
from engine_testlib import ENGINES, REFERENCE_LRS, engines_with, engines_with_option, load_results
from rlflow.algos import loss_agg_modes
from rlflow.engines import Capability, DelegatingEngine, ENGINE_REGISTRY, ModuleEngine

TOKEN_TOL = 1e-5
# The session fixtures each run one multi-configuration launch (about a minute of CPU); on a
# heavily shared machine that can pass pytest.ini's 600 s, so allow more. A hang still fails.
pytestmark = pytest.mark.timeout(900)


def _results(folder: Path, name: str) -> dict[str, Any]:
    return load_results(folder, name)


def test_the_suite_runs_the_documented_ddp_engine_and_one_that_is_not_a_module_engine() -> None:
    assert {"fsdp", "fsdp2", "megatron", "test_ddp"} <= set(ENGINES)
    assert issubclass(ENGINE_REGISTRY.get("test_ddp"), ModuleEngine)
    megatron = ENGINE_REGISTRY.get("megatron")
    assert issubclass(megatron, DelegatingEngine) and not issubclass(megatron, ModuleEngine)
    assert "test_ddp" in engines_with(Capability.VALUE_MODEL) and "test_ddp" not in engines_with(Capability.MIXED_PRECISION)


# ------------------------------------------------------------------------------------- parity
PARITY_CASES = [(ws, label) for ws in (1, 2) for label in parity_configs(ws)]


@pytest.mark.parametrize("world_size,label", PARITY_CASES, ids=[f"ws{ws}-{label}" for ws, label in PARITY_CASES])
def test_three_steps_match_plain_pytorch(world_size: int, label: str, request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue("two_rank" if world_size == 2 else "one_rank")
    results = _results(folder, f"parity_ws{world_size}.pt")
    reference, run = results["reference"], results[label]
    assert run["lrs"] == pytest.approx(REFERENCE_LRS, rel=1e-12)
    for step, (loss, ref_loss) in enumerate(zip(run["losses"], reference["losses"])):
        assert abs(loss - ref_loss) <= TOKEN_TOL, f"step {step}: loss {loss} vs plain PyTorch {ref_loss}"
    assert run["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-5)
    assert set(run["params"]) == set(reference["params"])
    # relative error of the whole parameter vector, and element-wise. The element-wise check needs
    # an atol: the key-projection biases have an exactly-zero true gradient (softmax ignores a
    # per-query shift), so Adam turns fp32 round-off into lr-sized updates of random sign there.
    diff = sum(((run["params"][n] - p) ** 2).sum() for n, p in reference["params"].items()).sqrt()
    norm = sum((p**2).sum() for p in reference["params"].values()).sqrt()
    assert (diff / norm).item() <= 1e-4, f"parameters differ from plain PyTorch by {(diff / norm).item():.2e}"
    for name, param in reference["params"].items():
        torch.testing.assert_close(run["params"][name], param, rtol=1e-4, atol=1e-5, msg=name)
    # the reference really moved: parity is not two untouched copies of the initial weights
    assert reference["losses"][2] < reference["losses"][0]


def test_compile_runs_the_layers_through_torch_compile(two_rank: Path) -> None:
    """``compile=true`` builds more compiled graphs than the same engine without it (the baseline is not zero:
    an engine may compile other parts anyway, like megatron's fused SwiGLU); the parity test above checks
    their numbers against plain PyTorch."""
    results = _results(two_rank, "parity_ws2.pt")
    compiled = [label for label in parity_configs(2) if label.endswith("-compile")]
    assert compiled == [f"{name}-compile" for name in engines_with_option("compile")] and "fsdp2-compile" in compiled
    for label in compiled:
        plain = label.replace("-compile", "-rmpad1-mbs1")  # the same engine and micro-batches, compile off
        graphs, plain_graphs = results[label]["compiled_graphs"], results[plain]["compiled_graphs"]
        assert graphs > plain_graphs, f"{label}: {graphs} compiled graphs, {plain_graphs} without compile"


# ------------------------------------------------------------------------ gradient accumulation
@pytest.mark.parametrize("mode", loss_agg_modes())
@pytest.mark.parametrize("engine", ENGINES + (FSDP2_REDUCE_EVERY_MICRO,))
def test_gradient_accumulation_matches_whole_batch(engine: str, mode: str, two_rank: Path) -> None:
    results = _results(two_rank, "grad_accumulation.pt")
    reference, run = results[("reference", mode)], results[(engine, mode)]
    assert run["num_micro_batches"] == 4  # 4 rows per rank, micro_batch_size 1, 2 ranks
    assert run["loss"] == pytest.approx(reference["loss"], abs=TOKEN_TOL, rel=TOKEN_TOL)
    assert set(run["grads"]) == set(reference["grads"])
    for name, grad in reference["grads"].items():
        torch.testing.assert_close(run["grads"][name], grad, atol=TOKEN_TOL, rtol=TOKEN_TOL, msg=name)


# -------------------------------------------------------------------------------------- packing
@pytest.mark.parametrize("engine", ENGINES)
def test_packed_and_padded_forwards_agree(engine: str, one_rank: Path) -> None:
    results = _results(one_rank, "packing.pt")
    ref_log_probs, ref_entropy = results["reference"]
    padded = results[(engine, "padded")]
    for label in ("packed", "padded", "dynamic", "small_chunks"):
        run = results[(engine, label)]
        torch.testing.assert_close(run["log_probs"], ref_log_probs, atol=TOKEN_TOL, rtol=0, msg=label)
        torch.testing.assert_close(run["entropy"], ref_entropy, atol=TOKEN_TOL, rtol=0, msg=label)
        torch.testing.assert_close(run["log_probs"], padded["log_probs"], atol=TOKEN_TOL, rtol=0, msg=label)
    assert results[(engine, "dynamic")]["num_micro_batches"] > 1
    assert ref_log_probs.abs().sum() > 0 and ref_entropy.abs().sum() > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_target_ids_are_scored_in_place_of_the_next_tokens(engine: str, one_rank: Path) -> None:
    """A batch's ``target_ids`` (a Tinker datum's per-position targets): packed and padded, each column's log-prob
    is the HF model's log-prob of the target there, not of the token the row holds."""
    results = _results(one_rank, "packing.pt")
    reference = results["targets_reference"]
    for packed in (True, False):
        torch.testing.assert_close(results[(engine, "targets", packed)], reference, atol=TOKEN_TOL, rtol=0, msg=str(packed))
    assert (reference - results["targets_untargeted"]).abs().max() > 1000 * TOKEN_TOL  # the targets change the scores


@pytest.mark.parametrize("engine", engines_with_option("share_prefix"))
def test_shared_prompts_over_dynamic_micro_batches_match_the_hf_model(engine: str, one_rank: Path) -> None:
    """``share_prefix`` through the engine, its prompts laid out once over several dynamic micro-batches (the
    planning itself: ``test_prefix_sharing.py``): the log-probs equal the HF model's on the padded batch."""
    results = _results(one_rank, "packing.pt")
    run = results[(engine, "shared_prefix")]
    assert run["num_micro_batches"] > 1
    torch.testing.assert_close(run["log_probs"], results["grouped_reference"], atol=TOKEN_TOL, rtol=0)


# ------------------------------------------------------------------------------------ HF export
@pytest.mark.parametrize("engine", ENGINES)
def test_export_from_two_ranks_loads_in_transformers(engine: str, two_rank: Path) -> None:
    run = _results(two_rank, "export.pt")[engine]
    assert run["missing"] == [] and run["unexpected"] == []
    assert run["exported_names"] == run["hf_names"]
    assert run["stored_dtypes"] == {torch.float32}
    assert run["bf16_export_order_kept"] and run["bf16_export_is_the_cast"]
    assert run["max_weight_diff"] == 0.0
    assert run["max_logprob_diff"] <= TOKEN_TOL
    assert run["tokenizer_vocab"] > 100
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(run["files"])


# ---------------------------------------------------------------------------------- value model
@pytest.mark.parametrize("engine", engines_with(Capability.VALUE_MODEL))
def test_value_engine(engine: str, two_rank: Path) -> None:
    results = _results(two_rank, "value.pt")
    for packed in (True, False):
        torch.testing.assert_close(results[(engine, packed)], results["direct"], atol=TOKEN_TOL, rtol=0)
    saved = results[(engine, "saved")]
    assert not torch.allclose(saved["engine"], results["direct"])  # the step changed the values
    torch.testing.assert_close(saved["reloaded"], saved["engine"], atol=TOKEN_TOL, rtol=0)
    assert {"model.safetensors", "config.json"} <= set(saved["files"])
    assert saved["architectures"] == ["Qwen2ForSequenceClassification"]  # the source folder's class, round-tripped
    assert saved["fresh_architectures"] == ["Qwen2ForTokenClassification"]  # a critic started from a causal LM
    assert set(saved["fresh_head"]) == {"score.weight", "score.bias"}
    for name, tensor in saved["expected_fresh_head"].items():
        assert torch.equal(saved["fresh_head"][name], tensor), name
    # initialised, not left as whatever memory held (both sides come from the same process: equality alone
    # would not see a loader that stopped initialising missing weights)
    assert saved["fresh_head"]["score.weight"].abs().max() < 1.0 and saved["fresh_head"]["score.weight"].std() > 0


# ---------------------------------------------------------------------------- optimizer steps
@pytest.mark.parametrize("engine", ENGINES)
def test_optimizer_step_behaviour(engine: str, one_rank: Path) -> None:
    results = _results(one_rank, "behaviour.pt")
    run = results[engine]
    assert run["skipped"]["skipped"] is True and run["skipped"]["skipped_steps"] == 1
    assert run["unchanged_after_skip"]
    assert run["overridden"] == {**run["overridden"], "lr": 0.0, "skipped": False, "skipped_steps": 1}
    assert run["unchanged_after_zero_lr"]
    # the override lasted one step; the schedule kept counting (step 2 of cosine/warmup 1/total 3)
    assert run["scheduled"]["lr"] == pytest.approx(REFERENCE_LRS[2]) and not run["scheduled"]["skipped"]
    assert run["offload_round_trip"]
    assert run["inside_eval"] is False and run["after_eval"] is True


@pytest.mark.parametrize("engine", engines_with(Capability.MIXED_PRECISION))
def test_bf16_compute_keeps_fp32_master_weights(engine: str, one_rank: Path) -> None:
    results = _results(one_rank, "behaviour.pt")
    run = results[(engine, "bf16")]
    assert run["master_dtypes"] == {torch.float32}
    assert run["loss"] == pytest.approx(results["fp32_loss"], abs=5e-2)
    assert run["loss"] != results["fp32_loss"]  # it really computed in bf16
    assert not run["step"]["skipped"] and run["step"]["grad_norm"] > 0
