"""Forward-only passes (log-probs, reference, values, reward scores) have their own micro-batch settings, as verl's
``log_prob_micro_batch_size_per_gpu`` / ``log_prob_use_dynamic_bsz`` / ``log_prob_max_token_len_per_gpu``; null
takes the training ones. ``run_forward_backward`` (every HF-module engine) is run with a stand-in forward: what is
under test is which limits plan the micro-batches; the megatron schedule reads the same ``micro_batch_limits``."""

from __future__ import annotations

import torch

from engine_testlib import make_batch
from rlflow.engines.common.forward.forward_backward import run_forward_backward
from rlflow.engines.config import EngineConfig
from rlflow.protocol import DataProto


def _rows_seen(config: EngineConfig, forward_only: bool) -> list[int]:
    """The row count of each micro-batch the forward receives for an 8-row batch."""
    sizes: list[int] = []

    def forward(micro: DataProto) -> dict[str, torch.Tensor]:
        sizes.append(len(micro))
        return {"log_probs": micro.batch["attention_mask"].float().requires_grad_(not forward_only)}

    def loss_fn(outputs, micro, context):
        return (outputs["log_probs"] * micro.batch["loss_mask"]).sum(), {}

    run_forward_backward(make_batch(0), forward, None if forward_only else loss_fn, forward_only, config,
                         group=None, device=torch.device("cpu"))
    return sizes


def test_forward_only_passes_use_the_forward_micro_batch_size():
    config = EngineConfig(name="x", micro_batch_size=4, forward_micro_batch_size=1)
    assert _rows_seen(config, forward_only=False) == [4, 4]
    assert _rows_seen(config, forward_only=True) == [1] * 8
    assert _rows_seen(EngineConfig(name="x", micro_batch_size=4), forward_only=True) == [4, 4]  # null: the training size


def test_forward_only_token_budget_and_dynamic_switch():
    lengths = make_batch(0).batch["attention_mask"].sum(-1)
    config = EngineConfig(name="x", micro_batch_size=8, forward_use_dynamic_bsz=True,
                          forward_max_token_len_per_micro_batch=int(lengths.max()))
    assert _rows_seen(config, forward_only=False) == [8]  # training stays fixed-size
    forward = _rows_seen(config, forward_only=True)
    assert sum(forward) == 8 and len(forward) > 1  # split by the forward budget (no micro-batch over the longest row)
    assert config.micro_batch_limits(training=False) == {"micro_batch_size": 8, "use_dynamic_bsz": True,
                                                          "max_token_len": int(lengths.max())}
    inherit = EngineConfig(name="x", use_dynamic_bsz=True, max_token_len_per_micro_batch=512)
    assert inherit.micro_batch_limits(training=False) == inherit.micro_batch_limits(training=True)
