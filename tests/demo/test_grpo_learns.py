"""Issue 7 acceptance, "GRPO learns": ``recipes/grpo_tiny_cpu.sh`` (vLLM rollout, FSDP2 actor, Ray
worker groups) raises greedy val accuracy on the demo's arithmetic task from an SFT warm start.

The run is the GRPO phase of the reduced ``recipes/demo.sh`` (the ``demo`` fixture of
``conftest.py``, which calls that recipe), seeded end to end (data, init, sampling, engine).
The same recipe with ``ENGINE=torchtitan`` (actor and reference on torchtitan, weights synced
into vLLM after every update) must gain the same margin from the same warm start in as many steps.
With ``ENGINE=megatron`` at tensor parallel size 2 (two worker processes, one data-parallel group
of two TP ranks, weights gathered from both and synced into vLLM) it must gain that margin too, with
the train/inference log-prob mismatch at fp32 noise (issue 14).
``recipes/grpo_lora_tiny_cpu.sh`` (LoRA adapters on the FSDP2 actor, the reference from its
disabled adapters, merged weights synced into vLLM) must gain at least half of what the full
fine-tuning run gained, from the same warm start in as many steps (issue 19).
``async_training.mode=one_step_off`` (split placement: actor, reference and rollout pools, samples one
version old, token TIS on by default) must gain at least the sync run's gain less ``ONE_STEP_OFF_TOLERANCE``
from the same warm start with as many samples (issue 43; a larger gain passes).

MARGIN: docs/demo.md has the measurements behind it. The torchtitan and megatron runs are in the
``full`` tier (``make test-full``); each starts only when its test runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from demo_runner import REPO, VAL_ACCURACY, RecipeProcess, read_metrics, run_recipe

pytestmark = pytest.mark.timeout(1800)

MARGIN = 0.08
ONE_STEP_OFF_TOLERANCE = 0.05  # issue 43: within 5 points of the sync run's gain (docs/async.md has the measurements)
ONE_STEP_OFF = ["async_training.mode=one_step_off", "trainer.placement=split", "rollout.num_replicas=1",
                "trainer.cpus_per_proc=0.5"]  # three processes (actor, reference, rollout) on two cores


def test_grpo_raises_val_accuracy_from_a_warm_start(demo):
    assert_learns(demo.metrics("grpo"))


def _warm_start_env(demo, out: Path) -> dict[str, str]:
    """The recipe inputs of a run from the demo's SFT warm start, as many steps and the same seed as its GRPO run."""
    return {"MODEL": str(demo.out / "sft" / "hf"), "DATA": str(demo.out / "data"), "OUT": str(out),
            "STEPS": str(demo.grpo_steps), "SEED": demo.knobs["DEMO_SEED"]}


def _recipe_run(demo, tmp_path_factory, name: str, script: str, env: dict[str, str]):
    """A recipe run from the demo's warm start, started when a test first asks for it, killed after the module."""
    out = tmp_path_factory.mktemp(name) / name
    process = RecipeProcess(REPO / "recipes" / script, {**_warm_start_env(demo, out), **env}, (), out.with_suffix(".log"))
    yield out, process
    process.kill()


@pytest.fixture(scope="module")
def torchtitan_run(demo, tmp_path_factory):
    yield from _recipe_run(demo, tmp_path_factory, "grpo_torchtitan", "grpo_tiny_cpu.sh", {"ENGINE": "torchtitan"})


@pytest.fixture(scope="module")
def lora_run(demo, tmp_path_factory):
    yield from _recipe_run(demo, tmp_path_factory, "grpo_lora", "grpo_lora_tiny_cpu.sh", {})


@pytest.mark.full  # make test: torchtitan's GRPO at TP2 (tests/ppo/test_tensor_parallel_rl.py) and its parity suites
def test_grpo_on_the_torchtitan_engine_learns_as_much(torchtitan_run):
    out, process = torchtitan_run
    process.wait()
    assert_learns(read_metrics(out))


def test_grpo_with_lora_gains_at_least_half_of_full_fine_tuning(demo, lora_run):
    out, process = lora_run
    log = process.wait()
    full, lora = demo.metrics("grpo"), read_metrics(out)
    assert lora[0][VAL_ACCURACY] == full[0][VAL_ACCURACY], "the runs did not start from the same warm start"
    full_gain = full[-1][VAL_ACCURACY] - full[0][VAL_ACCURACY]
    lora_gain = lora[-1][VAL_ACCURACY] - lora[0][VAL_ACCURACY]
    print(f"val accuracy gain in {demo.grpo_steps} steps: full fine-tuning {full_gain:.3f}, LoRA {lora_gain:.3f}")
    assert full_gain > MARGIN, f"full fine-tuning gained only {full_gain:.3f}: nothing to compare LoRA with"
    assert lora_gain >= 0.5 * full_gain, f"LoRA gained {lora_gain:.3f}, under half of full fine-tuning's {full_gain:.3f}"
    assert "reference: the actor's base model (LoRA adapters off)" in log
    assert lora[-1]["actor/ref_kl"] > 0, "the policy never moved away from its reference (the base model)"
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.full  # make test: megatron's GRPO at TP2 trains and syncs (tests/ppo/test_megatron_rl.py)
def test_grpo_on_the_megatron_engine_at_tp2_learns_as_much(demo, tmp_path):
    out = tmp_path / "grpo_megatron_tp2"
    tp2 = ["trainer.n_procs_per_node=2", "actor.engine.tensor_model_parallel_size=2",
           "ref.engine.tensor_model_parallel_size=2"]
    run_recipe(REPO / "recipes" / "grpo_tiny_cpu.sh", {**_warm_start_env(demo, out), "ENGINE": "megatron"}, tp2,
               log_path=out.with_suffix(".log"))
    records = read_metrics(out)
    print("megatron TP=2 val accuracy:", [round(r[VAL_ACCURACY], 3) for r in records if VAL_ACCURACY in r])
    assert_learns(records)
    mismatch = [r["rollout/logprob_diff_mean"] for r in records if "rollout/logprob_diff_mean" in r]
    assert mismatch and max(mismatch) <= 1e-4, f"train/inference log-prob mismatch {max(mismatch):.2e} is above fp32 noise"


@pytest.mark.full  # make test: one_step_off's staleness, correction and resume (tests/ppo/test_one_step_off.py)
def test_grpo_one_step_off_gains_as_much_as_sync(demo, tmp_path):
    out = tmp_path / "grpo_one_step_off"
    run_recipe(REPO / "recipes" / "grpo_tiny_cpu.sh", _warm_start_env(demo, out), ONE_STEP_OFF,
               log_path=out.with_suffix(".log"))
    sync, one_step_off = demo.metrics("grpo"), read_metrics(out)
    assert one_step_off[0][VAL_ACCURACY] == sync[0][VAL_ACCURACY], "the runs did not start from the same warm start"
    assert [r["async/staleness/max"] for r in one_step_off if "async/staleness/max" in r][1:] == [1] * (demo.grpo_steps - 1)
    sync_gain = sync[-1][VAL_ACCURACY] - sync[0][VAL_ACCURACY]
    one_step_off_gain = one_step_off[-1][VAL_ACCURACY] - one_step_off[0][VAL_ACCURACY]
    print(f"val accuracy gain in {demo.grpo_steps} steps: sync {sync_gain:.3f}, one_step_off {one_step_off_gain:.3f}")
    assert sync_gain > MARGIN, f"the sync run gained only {sync_gain:.3f}: nothing to compare with"
    assert one_step_off_gain >= sync_gain - ONE_STEP_OFF_TOLERANCE, "one step off lost more than the tolerance"


def assert_learns(records: list[dict]) -> None:
    before, after = records[0][VAL_ACCURACY], records[-1][VAL_ACCURACY]
    assert 0.05 <= before <= 0.7, f"the warm start is at {before:.3f} val accuracy, outside the regime this test is about"
    assert after > before + MARGIN, f"val accuracy {before:.3f} -> {after:.3f}: GRPO did not beat the margin {MARGIN}"
