"""Pure helpers of bench/grpo_vs_trl.py: FLOP formula, parsing both frameworks' step records,
the step statistics, choosing TRL's best configuration, and rlflow's settings per device."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from grpo_runs import parse_rlflow_metrics, parse_trl_lines, rlflow_overrides  # noqa: E402
from grpo_workload import StepStats, Workload, best_config, matmul_params, step_flops, with_other  # noqa: E402

from rlflow.trainer.entry_points import compose_ppo_config  # noqa: E402


def test_flops_count_generated_forward_and_trained_forward_backward():
    assert step_flops(10, generated_tokens=3, trained_tokens=5) == 2 * 10 * 3 + 6 * 10 * 5


def test_matmul_params_leave_out_the_input_embedding_only():
    named = [("model.embed_tokens.weight", 1000), ("model.layers.0.mlp.up_proj.weight", 40), ("lm_head.weight", 1000)]
    assert matmul_params(named) == 1040


def test_rlflow_metrics_become_step_records_with_the_rest_as_other():
    lines = [json.dumps({"timing_s/step": 10.0, "timing_s/gen": 3.0, "timing_s/update_actor": 5.0,
                         "timing_s/weight_sync": 0.5, "rollout/generated_tokens": 64.0, "perf/total_num_tokens": 96.0}),
             json.dumps({"val-core/score": 0.0}),  # a validation line: no step
             ""]
    (step,) = parse_rlflow_metrics(lines)
    assert step["generation"] == 3.0 and step["update"] == 5.0 and step["old_log_probs"] == 0.0
    assert step["other"] == pytest.approx(1.5)
    assert (step["generated_tokens"], step["trained_tokens"]) == (64.0, 96.0)


def test_trl_lines_skip_trl_logging_and_keep_settings():
    lines = ["{'loss': '0'}", json.dumps({"event": "settings", "trl_threads": 2}),
             json.dumps({"event": "step", "step_s": 4.0, "generation": 1.0, "old_log_probs": 0.0, "update": 2.5,
                         "weight_sync": 0.0, "generated_tokens": 8.0, "trained_tokens": 20.0}),
             json.dumps({"event": "done", "peak_rss_mb": 1.0})]
    steps, settings = parse_trl_lines(lines)
    assert settings == {"trl_threads": 2}
    assert len(steps) == 1 and steps[0]["other"] == pytest.approx(0.5)


def test_other_is_never_negative():
    assert with_other({"step_s": 1.0, "generation": 0.7, "update": 0.4})["other"] == 0.0


def test_summary_medians_and_token_rates():
    steps = [with_other({"step_s": s, "generation": s / 2, "update": s / 2, "generated_tokens": 100.0,
                         "trained_tokens": 300.0}) for s in (3.0, 1.0, 2.0)]
    summary = StepStats("x", steps).summary()
    assert (summary["min_s"], summary["median_s"], summary["max_s"]) == (1.0, 2.0, 3.0)
    assert summary["generation_s"] == 1.0 and summary["generated_tok_per_s"] == 50.0
    assert summary["trained_tok_per_s"] == 150.0


def test_best_config_is_the_fastest_and_empty_trials_are_an_error():
    assert best_config({"1 thread": 5.0, "2 threads": 3.0, "2 threads gc": 4.0}) == "2 threads"
    with pytest.raises(ValueError, match="no TRL configuration"):
        best_config({})


@pytest.mark.parametrize("device, rollout, tuned, compiled, eager, varlen",
                         [("cpu", "vllm", True, True, False, True), ("cpu", "vllm", False, False, True, True),
                          ("cuda", "hf", True, False, False, False)])
def test_rlflow_settings_compose_per_device_and_rollout(device, rollout, tuned, compiled, eager, varlen):
    """"rlflow best" on a CPU compiles its layers and vLLM's graphs, attends with sdpa_varlen and shares each group's
    prompt; "rlflow defaults" there gets the last two from ``auto`` but not the compiling, which a short run does not
    repay; a GPU run with HF generate keeps the GPU's auto values."""
    overrides = rlflow_overrides(Workload(device=device), Path("/m"), Path("/d"), Path("/run"), 3, 1, rollout,
                                 tuned=tuned)
    config = compose_ppo_config(overrides)
    assert (config.trainer.device, config.rollout.name) == (device, rollout)
    assert (config.actor.engine.compile, config.rollout.enforce_eager) == (compiled, eager)
    assert config.actor.engine.attn_implementation == ("sdpa_varlen" if varlen else "sdpa")
    assert config.actor.engine.share_prefix == varlen
