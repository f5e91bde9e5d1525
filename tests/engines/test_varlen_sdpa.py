"""``attn_implementation=sdpa_varlen`` (``rlflow.engines.common.batching.varlen_sdpa``) against the HF model's own sdpa on
the padded batch: log-probs, values and gradients, packed and padded layouts, left and right padding, GQA, on the
CPU and (marked ``gpu``, ``make test-gpu``) on a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from rlflow.engines.common.batching.packing import make_token_stream
from rlflow.engines.common.batching.cpu_attention_dtype import FP32_UP_TO, attention_compute_dtype
from rlflow.engines.common.batching.varlen_sdpa import SDPA_VARLEN, sdpa_varlen_attention, sequence_grid
from rlflow.engines.common.forward.hf_module import forward_micro_batch, load_forward_module
from rlflow.engines.common.forward.models import MODEL_KIND_REGISTRY
from rlflow.engines.config import HFModuleEngineConfig, config_from_mapping
from rlflow.protocol import DataProto

TOL = 1e-5  # fp32: the grid's attention sums in another order than the padded batch's
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(0, 5))
def test_every_real_slot_reads_its_own_grid_cell(lengths: list[int], gap: int) -> None:
    starts, slot = [], 0
    for length in lengths:
        starts.append(slot)
        slot += length + gap  # slots between sequences belong to none (filler, padding)
    sequence_slots, token_slots = sequence_grid([torch.arange(s, s + n) for s, n in zip(starts, lengths)], slot)
    flat = sequence_slots.reshape(-1)
    for start, length in zip(starts, lengths):
        for offset in range(length):
            assert flat[token_slots[start + offset]] == start + offset
    for row, (start, length) in enumerate(zip(starts, lengths)):  # past a sequence's end: its last token
        assert sequence_slots[row, length:].eq(start + length - 1).all()


def _batch(padding_side: str) -> DataProto:
    generator = torch.Generator().manual_seed(5)
    lengths = torch.tensor([24, 5, 13, 1, 17, 24])
    ids = torch.randint(3, 100, (len(lengths), 24), generator=generator)
    columns = torch.arange(24)[None, :]
    real = columns >= 24 - lengths[:, None] if padding_side == "left" else columns < lengths[:, None]
    loss_mask = real.float()
    return DataProto.from_dict({"input_ids": ids, "attention_mask": real.long(), "loss_mask": loss_mask})


def _engine_config(attn: str, remove_padding: bool) -> HFModuleEngineConfig:
    return config_from_mapping(HFModuleEngineConfig, {"name": "fsdp2", "attn_implementation": attn,
                                                      "use_remove_padding": remove_padding, "logprob_chunk_size": 16})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["causal_lm", "value"])
@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("remove_padding", [True, False], ids=["packed", "padded"])
def test_outputs_and_gradients_match_the_hf_model_on_the_padded_batch(
    model_path: Path, kind: str, padding_side: str, remove_padding: bool, device: str
) -> None:
    """Through the engines' own path (``load_forward_module`` + ``forward_micro_batch``), unwrapped; on the GPU
    both kernels run there and the HF sdpa reference is the GPU's own (fp32 matmuls without TF32, PyTorch's default)."""
    batch = _batch(padding_side)
    runs = {}
    for attn, layout in ((SDPA_VARLEN, remove_padding), ("sdpa", False)):
        config = _engine_config(attn, layout)
        module = load_forward_module(MODEL_KIND_REGISTRY.get(kind), model_path, config, rank=0).to(device).train()
        outputs = forward_micro_batch(module, batch, config, attn, torch.device(device), hidden_size=10**6)
        key = "log_probs" if kind == "causal_lm" else "values"
        values = outputs[key].cpu() * batch.batch["loss_mask"]
        (values * torch.linspace(-1, 1, values.shape[-1])).sum().backward()
        grads = {name: param.grad.to("cpu", copy=True)
                 for name, param in module.named_parameters() if param.grad is not None}
        runs[attn] = (values.detach(), grads)
    (ours, our_grads), (reference, reference_grads) = runs[SDPA_VARLEN], runs["sdpa"]
    assert reference.abs().sum() > 0
    torch.testing.assert_close(ours, reference, atol=TOL, rtol=0)
    assert our_grads.keys() == reference_grads.keys()
    for name, grad in reference_grads.items():
        torch.testing.assert_close(our_grads[name], grad, atol=TOL, rtol=TOL, msg=name)


def test_the_model_has_grouped_query_attention(model_path: Path) -> None:
    """The comparisons above cover GQA only if the test model has fewer key/value heads than heads."""
    config = AutoModelForCausalLM.from_pretrained(model_path).config
    assert config.num_key_value_heads < config.num_attention_heads


def test_calls_it_cannot_serve_say_what_to_use(model_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation=SDPA_VARLEN)
    with pytest.raises(ValueError, match="needs the token stream's sequence_slots"):
        model(input_ids=torch.tensor([[5, 6, 7]]))
    holes = torch.tensor([[1, 0, 1, 1]])
    with pytest.raises(ValueError, match="side by side"):
        make_token_stream(torch.tensor([[5, 6, 7, 8]]), holes, None, remove_padding=False, attn_implementation=SDPA_VARLEN)


@pytest.mark.parametrize("lengths, fp32_kernel", [([30, 88, 57], True), ([FP32_UP_TO + 1, 20], False)])
def test_bf16_on_a_cpu_runs_the_fp32_kernel_on_short_grids(lengths: list[int], fp32_kernel: bool) -> None:
    """``cpu_attention_dtype``: a short bf16 grid gives exactly the fp32 kernel's output rounded once to bf16 (the
    bf16 kernel would round inside); a grid past ``FP32_UP_TO`` positions keeps the bf16 kernel."""
    torch.manual_seed(0)
    slots, start = [], 0
    for length in lengths:
        slots.append(torch.arange(start, start + length))
        start += length
    sequence_slots, token_slots = sequence_grid(slots, start)
    query, key, value = (torch.randn(1, heads, start, 64).to(torch.bfloat16) for heads in (8, 4, 4))

    def attend(*states: torch.Tensor) -> torch.Tensor:
        output, _ = sdpa_varlen_attention(None, *states, None, sequence_slots=sequence_slots, token_slots=token_slots)
        return output

    in_fp32 = attend(query.float(), key.float(), value.float()).to(torch.bfloat16)
    assert (attention_compute_dtype(query.expand(len(lengths), -1, -1, -1)) is torch.float32) == fp32_kernel
    assert torch.equal(attend(query, key, value), in_fp32) == fp32_kernel
    assert attend(query, key, value).dtype == torch.bfloat16
