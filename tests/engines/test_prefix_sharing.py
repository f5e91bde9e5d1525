"""``share_prefix`` (``rlflow.engines.common.prefix_sharing``): rows that begin with the same prompt run it once,
and their log-probs, values and gradients equal the HF model's own sdpa on the padded batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlflow.engines.common.hf_module import forward_micro_batch, load_forward_module
from rlflow.engines.common.models import get_model_kind
from rlflow.engines.common.prefix_sharing import shared_prefix_stream
from rlflow.engines.common.varlen_sdpa import SDPA_VARLEN, sequence_grid
from rlflow.engines.config import EngineConfigError, HFModuleEngineConfig, config_from_mapping
from rlflow.protocol import DataProto

TOL = 1e-5  # fp32: the shared stream sums attention and gradients in another order than the padded batch
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
PROMPT, RESPONSE = 8, 7
# (prompt length, prompt id, response length): groups of one prompt with several responses, a prompt of
# another length, and a row with no response (all of it is prefix: it joins its prompt's group)
ROWS = [(6, 0, 7), (6, 0, 3), (6, 0, 5), (4, 1, 2), (4, 1, 7), (8, 2, 4), (6, 0, 0), (3, 3, 6)]


def _batch() -> DataProto:
    """RL rows: left-padded prompts (the same tokens for the same prompt id), right-padded responses."""
    generator = torch.Generator().manual_seed(3)
    prompts = {pid: torch.randint(3, 100, (length,), generator=generator) for length, pid, _ in ROWS}
    ids = torch.zeros(len(ROWS), PROMPT + RESPONSE, dtype=torch.long)
    mask, loss_mask = torch.zeros_like(ids), torch.zeros(ids.shape)
    for row, (length, pid, response) in enumerate(ROWS):
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
        module = load_forward_module(get_model_kind(kind), model_path, config, rank=0).to(device).train()
        outputs = forward_micro_batch(module, batch, config, config.attn_implementation, torch.device(device),
                                      share_prefix=config.share_prefix)
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
