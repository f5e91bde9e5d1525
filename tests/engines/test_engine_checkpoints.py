"""Engine checkpoints in real processes over gloo (the launches are the session fixtures of conftest.py).

Exact resume at the same world size, a SIGKILLed save, the setup check's errors, and resume
onto another world size: a checkpoint written by 2 ranks continues on 1 rank (DCP reshards
model and optimizer state) for every engine declaring ``Capability.RESHARD``, with the AdamW
kernels it is configured with rather than the saved run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine_testlib import ENGINES, engines_with, load_results
from rlflow.engines.base import Capability

# fp32 tolerance of a loss computed by 1 rank vs the same loss reduced over 2 ranks, 3 Adam steps on
# (the summation order differs; measured differences are ~1e-7): the parity suite's token tolerance.
LOSS_TOL = 1e-5
pytestmark = pytest.mark.timeout(900)  # these tests may be the first to need a launch (see conftest.py)


@pytest.mark.parametrize("engine", ENGINES)
def test_resume_is_bit_identical(engine: str, two_rank: Path) -> None:
    run = load_results(two_rank, "checkpoint.pt")[engine]
    assert run["resumed"]["losses"] == run["uninterrupted"]["losses"]
    assert run["resumed"]["grad_norms"] == run["uninterrupted"]["grad_norms"]
    assert run["resumed"]["lrs"] == run["uninterrupted"]["lrs"]
    assert {"engine_meta.json", "model_optim", "rng_rank0.pt", "rng_rank1.pt"} <= set(run["files"])


@pytest.mark.parametrize("engine", engines_with(Capability.RESHARD))
def test_two_rank_checkpoint_resumes_on_one_rank_with_the_same_losses_and_its_own_adamw_kernels(
    engine: str, two_rank: Path, one_rank: Path
) -> None:
    reference = load_results(two_rank, "checkpoint.pt")[engine]["uninterrupted"]  # 6 steps on 2 ranks, no stop
    resumed = load_results(one_rank, "reshard.pt")[engine]
    run = resumed["resumed"]  # steps 4-6 on 1 rank from the 2-rank checkpoint of step 3
    assert run["lrs"] == reference["lrs"], "the LR schedule continues where it stopped"
    for step, (loss, ref_loss) in enumerate(zip(run["losses"], reference["losses"]), start=4):
        assert abs(loss - ref_loss) <= LOSS_TOL, f"step {step}: loss {loss} at world size 1 vs {ref_loss} at 2"
    assert run["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-5)
    assert set(resumed["kernels"]) == {(True, None)}, "the configured fused AdamW, not the saved run's foreach one"
    assert reference["losses"][-1] < reference["losses"][0] - 1e-3, "the steps must actually train"
    # RNG rule: rank 0 existed in the checkpoint, so it restores its own stream
    saved = torch.load(two_rank / f"ckpt_{engine}" / "rng_rank0.pt", weights_only=True)
    assert torch.equal(resumed["rng_after_load"], saved["torch"])
    meta = (two_rank / f"ckpt_{engine}" / "engine_meta.json").read_text()
    assert '"world_size": 2' in meta


def test_interrupted_save_leaves_previous_checkpoint(one_rank: Path, killed: tuple[Path, Any]) -> None:
    out, death = killed
    assert death is not None and death.signal_name == "SIGKILL", "the save was supposed to be killed mid-write"
    partial = out / "ckpt_killed.tmp"
    assert (partial / "model_optim").is_dir() and not (partial / "engine_meta.json").exists()
    expected = torch.load(out / "killed_probe.pt")
    resumed = load_results(one_rank, "resumed_probe.pt")["log_probs"]
    assert torch.equal(resumed, expected)


def test_checkpoint_errors_say_what_is_wrong(one_rank: Path) -> None:
    errors = load_results(one_rank, "checkpoint_errors.pt")
    assert "no engine checkpoint" in errors["missing"] and "no_such_checkpoint" in errors["missing"]
    assert "engine: checkpoint 'fsdp' vs this engine 'fsdp2'" in errors["other_engine"]
    assert "layout: checkpoint {'sharding_strategy': 'FULL_SHARD'} vs this engine {'dp_replicate': 1}" in errors["other_engine"]
    assert "world_size" not in errors["other_engine"], "fsdp2 reshards: the world size is not a difference"
    fixed = errors["fixed_engine"]
    assert "world_size: checkpoint 2 vs this engine 1" in errors["other_world_size"], f"{fixed} cannot reshard"
    assert "\n" not in errors["other_world_size"]
