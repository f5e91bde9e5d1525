"""ValueHeadModel: values from the causal LM's final hidden states, save/load round trip, deterministic head init."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from rlflow.models.value_head import VALUE_HEAD_FILE, ValueHeadModel


def _ids(seed: int = 0, shape=(3, 11)) -> torch.Tensor:
    return torch.randint(3, 300, shape, generator=torch.Generator().manual_seed(seed))


def test_values_are_a_linear_head_on_the_causal_lm_hidden_states(tiny_preset):
    torch.manual_seed(0)
    model = ValueHeadModel.from_pretrained(tiny_preset, attn_implementation="eager")
    reference = AutoModelForCausalLM.from_pretrained(tiny_preset, local_files_only=True, attn_implementation="eager")
    ids = _ids()
    with torch.no_grad():
        hidden = reference(ids, output_hidden_states=True).hidden_states[-1]
        expected = hidden @ model.value_head.weight[0] + model.value_head.bias[0]
        values = model(ids)
    assert values.shape == ids.shape and values.dtype == torch.float32
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-6)
    assert values.std() > 0  # the head is not a constant


def test_right_padding_with_attention_mask_keeps_valid_values(tiny_preset):
    model = ValueHeadModel.from_pretrained(tiny_preset)
    short, long = _ids(1, (1, 5)), _ids(2, (1, 9))
    padded = torch.cat([torch.cat([short, torch.zeros(1, 4, dtype=torch.long)], dim=1), long])
    mask = torch.ones_like(padded)
    mask[0, 5:] = 0
    with torch.no_grad():
        batched = model(padded, attention_mask=mask)
        torch.testing.assert_close(batched[0, :5], model(short)[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched[1], model(long)[0], rtol=1e-5, atol=1e-5)


def test_save_and_load_round_trip(tiny_preset, tmp_path):
    torch.manual_seed(3)
    model = ValueHeadModel.from_pretrained(tiny_preset)
    with torch.no_grad():
        model.value_head.bias.fill_(0.25)
        model.model.norm.weight.mul_(1.5)  # a trained backbone differs from the preset
    model.save_pretrained(tmp_path)
    assert (tmp_path / VALUE_HEAD_FILE).is_file() and (tmp_path / "config.json").is_file()
    torch.manual_seed(99)  # a fresh init would differ; the saved head must win
    loaded = ValueHeadModel.from_pretrained(tmp_path)
    original, restored = model.state_dict(), loaded.state_dict()
    assert original.keys() == restored.keys()
    assert "value_head.weight" in restored and "model.layers.0.self_attn.q_proj.weight" in restored
    for name, tensor in original.items():
        assert torch.equal(tensor, restored[name]), name
    ids = _ids(4)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


def test_fresh_head_is_deterministic_under_the_torch_seed(tiny_preset):
    heads = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        heads.append(ValueHeadModel.from_pretrained(tiny_preset).value_head.weight.detach().clone())
    assert torch.equal(heads[0], heads[1])
    assert not torch.equal(heads[0], heads[2])


def test_gradients_reach_head_and_backbone(tiny_preset):
    model = ValueHeadModel.from_pretrained(tiny_preset)
    model(_ids()).square().mean().backward()
    assert model.value_head.weight.grad.abs().sum() > 0
    assert model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0


def test_bf16_backbone_and_head(tiny_preset):
    model = ValueHeadModel.from_pretrained(tiny_preset, torch_dtype="bf16")
    assert model.value_head.weight.dtype == torch.bfloat16
    assert model(_ids()).dtype == torch.float32


def test_mismatched_head_file_is_a_clear_error(tiny_preset, tmp_path):
    model = ValueHeadModel.from_pretrained(tiny_preset)
    model.save_pretrained(tmp_path)
    save_file({"score.weight": torch.zeros(1, 128)}, str(tmp_path / VALUE_HEAD_FILE))
    with pytest.raises(ValueError, match="value_head.weight"):
        ValueHeadModel.from_pretrained(tmp_path)
