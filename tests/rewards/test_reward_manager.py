"""RewardManager: token-level placement, custom functions, the error policy, and parallel == serial."""

from __future__ import annotations

import logging
import textwrap

import numpy as np
import pytest
import torch

from rlflow.config import ConfigError
from rlflow.config.schema import RewardConfig
from rlflow.errors import UserError
from rlflow.protocol import DataProto
from rlflow.rewards import REWARD_REGISTRY, RewardManager, UnknownDataSourceError, load_custom_function, score_batch

RESPONSE_LEN = 32

MIXED = [  # (data_source, response text, ground truth, expected score)
    ("synthetic/addition", "12+30=42\n#### 42", "42", 1.0),
    ("openai/gsm8k", "She pays 5*3=15.\n#### 15", "15", 1.0),
    ("lighteval/MATH", r"so $\boxed{\frac{1}{2}}$", "0.5", 1.0),
    ("synthetic/chain_arith", "#### 7", "8", 0.0),
    ("gsm8k", "no final answer", "3", 0.0),
    ("synthetic/addition", "", "0", 0.0),  # an empty response
]


def make_batch(tokenizer, rows) -> DataProto:
    """Responses as a rollout returns them: text + end-of-turn token, right-padded, with a response mask."""
    ids, masks = [], []
    for _, text, _, *_ in rows:
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        tokens = tokens if text else []
        ids.append(tokens + [tokenizer.pad_token_id] * (RESPONSE_LEN - len(tokens)))
        masks.append([1] * len(tokens) + [0] * (RESPONSE_LEN - len(tokens)))
    extra = np.empty(len(rows), dtype=object)
    extra[:] = [{"index": i} for i in range(len(rows))]
    return DataProto.from_dict(
        {"responses": torch.tensor(ids), "response_mask": torch.tensor(masks)},
        {"data_source": [r[0] for r in rows], "ground_truth": [r[2] for r in rows], "extra_info": extra},
    )


def test_scores_sit_on_the_last_response_token(tokenizer):
    batch = make_batch(tokenizer, MIXED)
    scores, metrics = score_batch(batch, tokenizer, RewardConfig())
    assert scores.shape == (len(MIXED), RESPONSE_LEN) and scores.dtype == torch.float32
    lengths = batch.batch["response_mask"].sum(dim=1)
    for row, (_, _, _, expected) in enumerate(MIXED):
        last = max(int(lengths[row]) - 1, 0)
        assert scores[row, last] == expected
        assert torch.count_nonzero(torch.cat([scores[row, :last], scores[row, last + 1:]])) == 0
    assert metrics["reward/error_count"] == 0
    assert metrics["reward/source/synthetic/addition/mean"] == 0.5
    assert metrics["reward/source/openai/gsm8k/mean"] == 1.0


CUSTOM_FILE = textwrap.dedent(
    """
    import math

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        if "boom" in solution_str:
            raise RuntimeError("reward exploded")
        if "nan" in solution_str:
            return math.nan
        if "text" in solution_str:
            return "one"
        if "nokey" in solution_str:
            return {"acc": 1.0}
        return {"score": len(solution_str) / 10 + extra_info["index"], "acc": float(solution_str == ground_truth)}
    """
)


@pytest.fixture
def custom_spec(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM_FILE)
    return f"{path}:compute_score"


FAILING = [  # (data_source, response, ground truth); rows 1-4 fail in different ways
    ("anything/at-all", "abc", "abc"),
    ("anything/at-all", "boom goes the reward", "x"),
    ("anything/at-all", "nan please", "x"),
    ("anything/at-all", "text", "x"),
    ("anything/at-all", "nokey", "x"),
    ("anything/at-all", "abcdefghij", "zzz"),
]


def test_custom_function_from_a_file_replaces_the_registry(tokenizer, custom_spec):
    rows = [FAILING[0], FAILING[5]]
    scores, metrics = score_batch(make_batch(tokenizer, rows), tokenizer, RewardConfig(custom_function=custom_spec))
    assert scores.sum(dim=1).tolist() == pytest.approx([0.3 + 0, 1.0 + 1])
    assert metrics["reward/extra/acc/mean"] == 0.5


def test_custom_function_from_a_module_path(tokenizer):
    rows = [("not/registered", "#### 4", "4", 1.0), ("not/registered", "#### 5", "4", 0.0)]
    config = RewardConfig(custom_function="rlflow.rewards.gsm8k:gsm8k_score")
    scores, _ = score_batch(make_batch(tokenizer, rows), tokenizer, config)
    assert scores.sum(dim=1).tolist() == [1.0, 0.0]


def test_failing_samples_get_error_score_and_are_logged(tokenizer, custom_spec, caplog):
    config = RewardConfig(custom_function=custom_spec, error_score=-1.0)
    with RewardManager(tokenizer, config) as manager, caplog.at_level(logging.WARNING, logger="rlflow"):
        scores, metrics = manager(make_batch(tokenizer, FAILING))
        assert scores.sum(dim=1).tolist() == pytest.approx([0.3, -1.0, -1.0, -1.0, -1.0, 1.0 + 5])
        assert metrics["reward/error_count"] == 4
        log = caplog.text
        assert "raised RuntimeError: reward exploded" in log and "'boom goes the reward'" in log
        assert "non-finite score nan" in log and "'nan please'" in log
        assert "expected a float" in log and "without a 'score' key" in log
        # the run goes on: the next batch scores normally
        scores, metrics = manager(make_batch(tokenizer, [FAILING[0]]))
        assert scores.sum().item() == pytest.approx(0.3) and metrics["reward/error_count"] == 0


def test_parallel_scoring_equals_serial(tokenizer, custom_spec):
    registry_batch = make_batch(tokenizer, MIXED * 3)
    custom_batch = make_batch(tokenizer, FAILING * 2)
    for config, batch in [(RewardConfig(), registry_batch), (RewardConfig(custom_function=custom_spec, error_score=-2.0), custom_batch)]:
        serial_scores, serial_metrics = score_batch(batch, tokenizer, config)
        config.num_workers = 2
        with RewardManager(tokenizer, config) as manager:
            parallel_scores, parallel_metrics = manager(batch)
            assert manager._pool is not None  # really went through worker processes
        assert torch.equal(serial_scores, parallel_scores)
        assert serial_metrics == parallel_metrics
    assert serial_metrics["reward/error_count"] == 8


def test_unknown_data_source_in_a_batch_is_an_error(tokenizer):
    batch = make_batch(tokenizer, [("openai/gsm8k", "#### 1", "1", 1.0), ("my/new_source", "#### 1", "1", 1.0)])
    with pytest.raises(UnknownDataSourceError, match="'my/new_source'"):
        score_batch(batch, tokenizer, RewardConfig())


def test_unpicklable_function_with_workers_is_a_clear_error(tokenizer, clean_registry):
    REWARD_REGISTRY.register("local/lambda")(lambda *args: 1.0)
    batch = make_batch(tokenizer, [("local/lambda", "a", "a", 1.0)] * 2)
    assert score_batch(batch, tokenizer, RewardConfig()).__getitem__(0).sum().item() == 2.0
    with pytest.raises(UserError, match="reward.num_workers=0"):
        score_batch(batch, tokenizer, RewardConfig(num_workers=2))


@pytest.mark.parametrize(
    "spec,match",
    [
        ("no_colon_here", "expected 'path/to/file.py:function'"),
        ("missing_file.py:fn", "does not exist"),
        ("rlflow.rewards.gsm8k:no_such_fn", "has no attribute 'no_such_fn'"),
        ("rlflow.rewards.registry:REWARD_REGISTRY", "not a function"),
        ("no_such_package.mod:fn", "cannot import no_such_package.mod"),
    ],
)
def test_bad_custom_function_spec_is_a_config_error(spec, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_custom_function(spec)
    assert "reward.custom_function" in str(info.value)


def answer_and_acc(data_source, solution_str, ground_truth, extra_info=None):
    """A reward reporting its extracted answer (``pred``) and an ``acc`` next to the score."""
    answer = solution_str.split("####")[-1].strip() if "####" in solution_str else None
    return {"score": float(answer == ground_truth), "pred": answer, "acc": answer == ground_truth}


def test_results_carry_each_samples_answer_and_extras(tokenizer):
    rows = [("synthetic/addition", "#### 42", "42"), ("synthetic/addition", "no answer", "42")]
    with RewardManager(tokenizer, RewardConfig(custom_function=f"{__name__}:answer_and_acc")) as manager:
        scores, metrics, results = manager.score_with_results(make_batch(tokenizer, rows))
    assert [r.pred for r in results] == ["42", None]
    assert [r.extras for r in results] == [{"acc": 1.0}, {"acc": 0.0}]  # pred is an answer, not a number to average
    assert scores.sum(-1).tolist() == [1.0, 0.0] and metrics["reward/extra/acc/mean"] == 0.5
