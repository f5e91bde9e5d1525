"""``balance_batch``: DP chunks of near-equal work, whole ``uid`` groups on one rank when prefixes are shared."""

from __future__ import annotations

import numpy as np
import torch

from rlflow.protocol import DataProto
from rlflow.trainer.batch_balance import balance_batch

PROMPT, RESPONSE = 6, 5


def _batch(groups: list[tuple[int, list[int]]]) -> DataProto:
    """One row per response; ``groups``: (prompt length, response lengths) per uid."""
    rows = [(uid, prompt, response) for uid, (prompt, responses) in enumerate(groups) for response in responses]
    order = np.random.default_rng(0).permutation(len(rows))  # rollout order is not group order
    rows = [rows[i] for i in order]
    mask = torch.zeros(len(rows), PROMPT + RESPONSE, dtype=torch.long)
    for row, (_, prompt, response) in enumerate(rows):
        mask[row, PROMPT - prompt:PROMPT + response] = 1
    return DataProto.from_dict({"input_ids": torch.arange(mask.numel()).reshape(mask.shape), "attention_mask": mask,
                                "responses": torch.zeros(len(rows), RESPONSE, dtype=torch.long)},
                               {"uid": np.array([f"u{uid}" for uid, _, _ in rows], dtype=object)})


def _computed_tokens(chunk: DataProto) -> int:
    """Tokens of a chunk with each uid's prompt counted once."""
    mask = chunk.batch["attention_mask"]
    prompts = {uid: int(mask[row, :PROMPT].sum()) for row, uid in enumerate(chunk.non_tensor_batch["uid"])}
    return sum(prompts.values()) + int(mask[:, PROMPT:].sum())


def test_shared_prefixes_keep_each_group_on_one_rank_and_balance_the_work() -> None:
    batch = _batch([(6, [5, 1, 3, 2]), (2, [4, 4, 1, 1]), (5, [5, 5, 5, 0]), (3, [2, 3, 1, 5])])
    chunks = balance_batch(batch, 2, share_prefix=True).chunk(2)
    owners = [set(chunk.non_tensor_batch["uid"]) for chunk in chunks]
    assert not owners[0] & owners[1] and len(owners[0]) == len(owners[1]) == 2
    split = balance_batch(batch, 2).chunk(2)  # row by row: groups split, each prompt computed on both ranks
    assert max(map(_computed_tokens, chunks)) < max(map(_computed_tokens, split))


def test_without_shared_prefixes_rows_are_balanced_one_by_one() -> None:
    batch = _batch([(6, [5, 1, 3, 2]), (2, [4, 4, 1, 1]), (5, [5, 5, 5, 0]), (3, [2, 3, 1, 5])])
    sums = [int(chunk.batch["attention_mask"].sum()) for chunk in balance_batch(batch, 2).chunk(2)]
    assert abs(sums[0] - sums[1]) <= 1


def test_groups_that_cannot_balance_stay_split() -> None:
    """Two groups over two ranks, one far heavier: whole groups would leave one rank with most of the work."""
    batch = _batch([(1, [5, 5, 5, 5]), (1, [1, 1, 1, 1])])
    chunks = balance_batch(batch, 2, share_prefix=True).chunk(2)
    assert all(len(set(chunk.non_tensor_batch["uid"])) == 2 for chunk in chunks)


def test_uneven_groups_fall_back_to_rows() -> None:
    batch = _batch([(6, [5, 1, 3]), (2, [4, 4, 1, 1, 2])])
    assert torch.equal(balance_batch(batch, 2, share_prefix=True).batch["attention_mask"],
                       balance_batch(batch, 2).batch["attention_mask"])
