"""Token-balanced dispatch over rollout replicas: balanced parts, and outputs restored to input order."""

from __future__ import annotations

import pytest
import torch

from rlflow.protocol import DataProto
from rlflow.rollout.balance import DP_BALANCED_TOKENS
from rlflow.workers import DispatchContext, get_dispatch_mode


def _prompts(lengths):
    width = max(lengths)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
    ids = torch.arange(len(lengths))[:, None].expand(-1, width).clone()
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask}, {"uid": [f"u{i}" for i in range(len(lengths))]})


@pytest.mark.parametrize("lengths, dp_size", [([30, 2, 2, 2, 28, 3, 1], 2), ([5, 9, 1, 8, 2, 2], 3), ([4], 2)])
def test_dispatch_balances_and_collect_restores_order(lengths, dp_size):
    mode = get_dispatch_mode(DP_BALANCED_TOKENS)
    ctx = DispatchContext("rollout.generate_sequences", world_size=dp_size)
    prompts = _prompts(lengths)
    calls = mode.dispatch(ctx, (prompts,), {})
    tokens = [int(calls[r][0][0].batch["attention_mask"].sum()) for r in range(dp_size)]
    padded_total = sum(tokens)
    assert max(tokens) - min(tokens) <= max(lengths)
    assert max(tokens) < padded_total  # not everything on one replica
    n = 3  # each replica answers n rows per prompt, as generate_sequences does
    outputs = {}
    for rank, (args, _) in calls.items():
        shard = args[0].repeat(n, interleave=True)
        shard.batch["sample"] = torch.arange(n).repeat(len(args[0]))
        shard.meta_info["metrics"] = {"rows": len(args[0])}
        outputs[rank] = shard
    merged = mode.collect(ctx, outputs)
    assert list(merged.non_tensor_batch["uid"]) == [f"u{i}" for i in range(len(lengths)) for _ in range(n)]
    assert merged.batch["input_ids"][:, 0].tolist() == [i for i in range(len(lengths)) for _ in range(n)]
    assert merged.batch["sample"].tolist() == list(range(n)) * len(lengths)


def test_dispatch_of_an_empty_batch():
    mode = get_dispatch_mode(DP_BALANCED_TOKENS)
    ctx = DispatchContext("m", world_size=2)
    empty = _prompts([3, 1])[0:0]
    calls = mode.dispatch(ctx, (empty,), {})
    merged = mode.collect(ctx, {r: args[0] for r, (args, _) in calls.items()})
    assert len(merged) == 0
