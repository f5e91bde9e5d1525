"""``share_prefix`` (``rlflow.engines.common.batching.prefix_sharing``): rows that begin with the same prompt run it once,
and their log-probs, values and gradients equal the HF model's own sdpa on the padded batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_testlib import reference_model, reference_token_stats
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.engines.common.batching.micro_batching import MicroBatchPlan, plan_micro_batches
from rlflow.engines.common.batching.prefix_sharing import prefix_row_groups, shared_prefix_stream
from rlflow.engines.common.batching.varlen_sdpa import SDPA_VARLEN, sequence_grid
from rlflow.engines.common.forward.forward_backward import run_forward_backward
from rlflow.engines.common.forward.hf_module import forward_micro_batch, load_forward_module
from rlflow.engines.common.forward.models import MODEL_KIND_REGISTRY
from rlflow.engines.config import EngineConfigError, HFModuleEngineConfig, config_from_mapping
from rlflow.protocol import DataProto

TOL = 1e-5  # fp32: the shared stream sums attention and gradients in another order than the padded batch
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
PROMPT, RESPONSE = 8, 7
# (prompt length, prompt id, response length): groups of one prompt with several responses, a prompt of
# another length, and a row with no response (all of it is prefix: it joins its prompt's group)
ROWS = [(6, 0, 7), (6, 0, 3), (6, 0, 5), (4, 1, 2), (4, 1, 7), (8, 2, 4), (6, 0, 0), (3, 3, 6)]
# GRPO-shaped: 3 prompts x 4 responses, which longest-first balancing deals out across micro-batches
GRPO_ROWS = [(5, pid, response) for pid, responses in enumerate([(7, 2, 6, 4), (3, 7, 5, 1), (6, 1, 2, 7)])
             for response in responses]


def _batch(rows: list[tuple[int, int, int]] = ROWS) -> DataProto:
    """RL rows: left-padded prompts (the same tokens for the same prompt id), right-padded responses."""
    generator = torch.Generator().manual_seed(3)
    prompts = {pid: torch.randint(3, 100, (length,), generator=generator) for length, pid, _ in rows}
    ids = torch.zeros(len(rows), PROMPT + RESPONSE, dtype=torch.long)
    mask, loss_mask = torch.zeros_like(ids), torch.zeros(ids.shape)
    for row, (length, pid, response) in enumerate(rows):
        ids[row, PROMPT - length:PROMPT] = prompts[pid]
        ids[row, PROMPT:PROMPT + response] = torch.randint(3, 100, (response,), generator=generator)
        mask[row, PROMPT - length:PROMPT + response] = 1
        loss_mask[row, PROMPT:PROMPT + response] = 1
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask})


def _config(**values: object) -> HFModuleEngineConfig:
    return config_from_mapping(HFModuleEngineConfig, {"name": "fsdp2", "logprob_chunk_size": 16, **values})


def test_each_distinct_prompt_is_laid_out_once() -> None:
    batch = _batch()
    stream = shared_prefix_stream(batch.batch["input_ids"], batch.batch["attention_mask"], None, batch.batch["loss_mask"])
    prompts = {pid: length for length, pid, _ in ROWS}
    assert stream.input_ids.numel() == sum(prompts.values()) + sum(response for _, _, response in ROWS)
    assert stream.input_ids.numel() < int(batch.batch["attention_mask"].sum())
    # every real token of every row reads the slot holding its own token
    flat_ids = batch.batch["input_ids"].reshape(-1)
    assert torch.equal(stream.input_ids.reshape(-1)[stream.slot_index], flat_ids[stream.batch_index])
    # each row's tokens are predicted once: one target per real token but the first, prefix targets shared
    assert len(stream.target_index) == len(set(stream.target_index.tolist()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["causal_lm", "value"])
def test_outputs_and_gradients_match_the_hf_model_on_the_padded_batch(model_path: Path, kind: str, device: str) -> None:
    """Through the engines' own path (``load_forward_module`` + ``forward_micro_batch``), unwrapped."""
    batch = _batch()
    runs = {}
    for name, config in (("shared", _config(attn_implementation=SDPA_VARLEN, share_prefix=True)),
                         ("hf", _config(attn_implementation="sdpa", use_remove_padding=False))):
        module = load_forward_module(MODEL_KIND_REGISTRY.get(kind), model_path, config, rank=0).to(device).train()
        outputs = forward_micro_batch(module, batch, config, config.attn_implementation, torch.device(device))
        values = outputs["log_probs" if kind == "causal_lm" else "values"].cpu() * batch.batch["attention_mask"]
        (values * torch.linspace(-1, 1, values.shape[-1])).sum().backward()
        grads = {n: p.grad.to("cpu", copy=True) for n, p in module.named_parameters() if p.grad is not None}
        runs[name] = (values.detach(), grads)
    (ours, our_grads), (reference, reference_grads) = runs["shared"], runs["hf"]
    assert reference.abs().sum() > 0
    torch.testing.assert_close(ours, reference, atol=TOL, rtol=0)
    assert our_grads.keys() == reference_grads.keys()
    for name, grad in reference_grads.items():
        torch.testing.assert_close(our_grads[name], grad, atol=TOL, rtol=TOL, msg=name)


def test_a_batch_with_target_ids_is_laid_out_unshared_and_scores_its_targets(model_path: Path) -> None:
    """Rows of one prompt may give its positions different targets (``target_ids``): with ``share_prefix`` on,
    such a batch is not shared, and every column scores its row's target as the padded HF forward does."""
    batch = _batch()
    targets = batch.batch["input_ids"].clone()
    targets[:, :PROMPT] = torch.arange(len(ROWS))[:, None]  # each row its own target at its prompt's positions
    batch.batch["target_ids"] = targets
    runs = {}
    for name, config in (("shared", _config(attn_implementation=SDPA_VARLEN, share_prefix=True)),
                         ("hf", _config(attn_implementation="sdpa", use_remove_padding=False))):
        module = load_forward_module(MODEL_KIND_REGISTRY.get("causal_lm"), model_path, config, rank=0)
        with torch.no_grad():
            runs[name] = forward_micro_batch(module, batch, config, config.attn_implementation, torch.device("cpu"))
    with torch.no_grad():
        expected = reference_token_stats(reference_model(model_path), batch)[0]  # of target_ids, from full logits
    torch.testing.assert_close(runs["shared"]["log_probs"], runs["hf"]["log_probs"], atol=TOL, rtol=0)
    torch.testing.assert_close(runs["hf"]["log_probs"], expected, atol=TOL, rtol=0)


def test_a_slot_in_several_sequences_reads_the_first() -> None:
    prefix = torch.arange(3)
    sequences = [torch.cat([prefix, torch.tensor([3, 4])]), torch.cat([prefix, torch.tensor([5])])]
    sequence_slots, token_slots = sequence_grid(sequences, 6)
    assert sequence_slots.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 5, 5]]
    assert token_slots.tolist() == [0, 1, 2, 3, 4, 8]


@pytest.mark.parametrize("values", [{"share_prefix": True}, {"share_prefix": True, "attn_implementation": SDPA_VARLEN,
                                                               "use_remove_padding": False}])
def test_kernels_that_cannot_share_a_prefix_are_refused(values: dict) -> None:
    with pytest.raises(EngineConfigError, match="share_prefix=true needs attn_implementation=sdpa_varlen"):
        _config(**values)


# ---------------------------------------------------------------------------------- micro-batch planning
def _prompt_computations(batch: DataProto, plan: MicroBatchPlan) -> int:
    """How many prompt copies the micro-batches compute: one per (micro-batch, distinct prompt) held."""
    groups = _groups(batch)
    group_of = {row: index for index, rows in enumerate(groups) for row in rows}
    return sum(len({group_of[row] for row in rows}) for rows in plan.groups)


def _groups(batch: DataProto) -> list[list[int]]:
    fields = batch.batch
    return prefix_row_groups(fields["input_ids"], fields["attention_mask"], None, fields["loss_mask"])


def test_rows_of_a_prompt_are_grouped_and_rows_that_share_nothing_stand_alone() -> None:
    batch = _batch()
    by_prompt: dict[int, list[int]] = {}
    for row, (_, pid, _) in enumerate(ROWS):
        by_prompt.setdefault(pid, []).append(row)
    assert sorted(map(sorted, _groups(batch))) == sorted(by_prompt.values())
    no_prefix = batch.batch["loss_mask"].clone()
    no_prefix[batch.batch["attention_mask"].bool()] = 1  # the loss covers every token: nothing is shared
    fields = batch.batch
    assert prefix_row_groups(fields["input_ids"], fields["attention_mask"], None, no_prefix) == [[r] for r in range(len(ROWS))]


@pytest.mark.parametrize("dynamic", [True, False])
def test_the_planner_keeps_a_prompts_rows_in_one_micro_batch(dynamic: bool) -> None:
    """Rows that arrive interleaved (as ``balance_batch`` may leave them, fixed mode) or that longest-first
    balancing deals out (dynamic mode) still go to one micro-batch per prompt, within the same limits: fewer
    prompt copies than when the rows are planned one by one."""
    batch = _batch(GRPO_ROWS)
    batch = batch[[row for member in range(4) for row in range(member, len(GRPO_ROWS), 4)]]  # interleaved
    lengths = batch.batch["attention_mask"].sum(-1).tolist()
    limits = dict(micro_batch_size=4, use_dynamic_bsz=dynamic, max_token_len=sum(lengths) // 3 + 4)
    grouped = plan_micro_batches(lengths, **limits, row_groups=_groups(batch))
    by_row = plan_micro_batches(lengths, **limits)
    assert sorted(row for rows in grouped.groups for row in rows) == list(range(len(GRPO_ROWS)))
    assert len(grouped.groups) == len(by_row.groups) == 3
    for rows in grouped.groups:
        assert len(rows) <= 4 if not dynamic else sum(lengths[row] for row in rows) <= limits["max_token_len"]
    assert _prompt_computations(batch, grouped) == 3  # each prompt computed once
    assert _prompt_computations(batch, by_row) > 3


@pytest.mark.parametrize("share", [True, False])
def test_the_engine_loop_plans_by_prompt_when_the_config_shares(share: bool) -> None:
    """``run_forward_backward`` reads ``share_prefix`` from the engine config: with it, the micro-batches it hands
    to the forward hold each prompt once in all; without it, rows are planned one by one and prompts repeat."""
    batch = _batch(GRPO_ROWS)
    batch = batch[[row for member in range(4) for row in range(member, len(GRPO_ROWS), 4)]]
    budget = int(batch.batch["attention_mask"].sum()) // 3 + 4
    config = _config(attn_implementation=SDPA_VARLEN, share_prefix=share, use_dynamic_bsz=True,
                     max_token_len_per_micro_batch=budget)
    prompt_copies = []

    def forward(micro: DataProto) -> dict[str, torch.Tensor]:
        prompt_copies.append(len(_groups(micro)))
        return {"log_probs": torch.zeros(micro.batch["input_ids"].shape)}

    run_forward_backward(batch, forward, None, True, config, group=None, device=torch.device("cpu"))
    assert len(prompt_copies) == 3
    assert (sum(prompt_copies) == 3) == share


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 30)), min_size=1, max_size=12), st.integers(30, 120))
def test_a_group_that_fits_the_budget_is_never_split(group_shapes: list[tuple[int, int]], budget: int) -> None:
    """Groups of ``rows`` rows of ``length`` tokens: every row planned once, no micro-batch over the budget, and
    a group whose tokens fit the budget in one micro-batch."""
    lengths, row_groups = [], []
    for rows, length in group_shapes:
        row_groups.append(list(range(len(lengths), len(lengths) + rows)))
        lengths += [length] * rows
    plan = plan_micro_batches(lengths, micro_batch_size=1, use_dynamic_bsz=True, max_token_len=budget,
                              row_groups=row_groups)
    assert sorted(row for rows in plan.groups for row in rows) == list(range(len(lengths)))
    assert all(sum(lengths[row] for row in rows) <= budget for rows in plan.groups)
    home = {row: index for index, rows in enumerate(plan.groups) for row in rows}
    for rows in row_groups:
        if sum(lengths[row] for row in rows) <= budget:
            assert len({home[row] for row in rows}) == 1
