"""Value models: HF sequence/token-classification folders load as themselves, a causal-LM folder gets a fresh
token-classification head, rlflow's former value_head.safetensors is the fallback; per-token values vs HF."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    Qwen2ForSequenceClassification,
    Qwen2ForTokenClassification,
)

from rlflow.models.value_models import LEGACY_VALUE_HEAD_FILE, load_value_model, per_token_values, value_model_export_config

TOL = dict(rtol=1e-5, atol=1e-5)  # fp32, same kernels; only reduction order may differ


def _ids(seed: int = 0, shape=(3, 11)) -> torch.Tensor:
    return torch.randint(3, 300, shape, generator=torch.Generator().manual_seed(seed))


def _save_classifier(auto_cls: type, source: Path, folder: Path, seed: int = 5, **kwargs) -> Path:
    torch.manual_seed(seed)  # a random head, as TRL/OpenRLHF would have trained one
    auto_cls.from_pretrained(source, num_labels=1, **kwargs).save_pretrained(folder)
    return folder


def test_sequence_classifier_scores_equal_hf_pooled_logits(tiny_preset, tmp_path):
    folder = _save_classifier(AutoModelForSequenceClassification, tiny_preset, tmp_path / "rm")
    model = load_value_model(folder).eval()
    assert type(model) is Qwen2ForSequenceClassification
    reference = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    reference.config.pad_token_id = None  # one unpadded row: HF pools the last token
    ids = _ids(1, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = (torch.arange(13) < 9).long()[None]
    with torch.no_grad():
        values = per_token_values(model, padded, attention_mask=mask)
        torch.testing.assert_close(values[0, 8], reference(ids).logits[0, 0], **TOL)
        assert values.shape == (1, 13) and values.dtype == torch.float32 and values[0, :9].std() > 0


def test_token_classifier_values_equal_hf_logits(tiny_preset, tmp_path):
    folder = _save_classifier(AutoModelForTokenClassification, tiny_preset, tmp_path / "critic")
    model = load_value_model(folder)
    assert type(model) is Qwen2ForTokenClassification and model.dropout.p == 0.0
    reference = AutoModelForTokenClassification.from_pretrained(folder).eval()
    ids = _ids(2)
    with torch.no_grad():
        torch.testing.assert_close(per_token_values(model, ids), reference(ids).logits.squeeze(-1), **TOL)


def test_causal_lm_folder_gets_a_seeded_fresh_head_on_its_backbone(tiny_preset):
    heads = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        model = load_value_model(tiny_preset)
        heads.append(model.score.weight.detach().clone())
    assert type(model) is Qwen2ForTokenClassification and model.config.num_labels == 1
    assert torch.equal(heads[0], heads[1]) and not torch.equal(heads[0], heads[2])
    causal = AutoModelForCausalLM.from_pretrained(tiny_preset)
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, causal.model.layers[0].mlp.up_proj.weight)


def test_legacy_value_head_folder_loads_and_saves_as_token_classifier(tiny_preset, tmp_path):
    legacy = tmp_path / "legacy"
    AutoModelForCausalLM.from_pretrained(tiny_preset).save_pretrained(legacy)  # rlflow's former critic folder
    hidden_size = AutoModelForCausalLM.from_pretrained(legacy).config.hidden_size
    weight = torch.randn(1, hidden_size, generator=torch.Generator().manual_seed(7)) * 0.05
    save_file({"value_head.weight": weight, "value_head.bias": torch.tensor([0.25])}, str(legacy / LEGACY_VALUE_HEAD_FILE))
    model = load_value_model(legacy)
    ids = _ids(3)
    with torch.no_grad():
        hidden = AutoModelForCausalLM.from_pretrained(legacy)(ids, output_hidden_states=True).hidden_states[-1]
        torch.testing.assert_close(per_token_values(model, ids), hidden @ weight[0] + 0.25, **TOL)
    model.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved" / LEGACY_VALUE_HEAD_FILE).exists()
    reloaded = AutoModelForTokenClassification.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits.squeeze(-1), per_token_values(model, ids), **TOL)


def test_bad_value_folders_fail_with_the_cause(tiny_preset, tmp_path):
    two_labels = tmp_path / "two"
    AutoModelForSequenceClassification.from_pretrained(tiny_preset, num_labels=2).save_pretrained(two_labels)
    with pytest.raises(ValueError, match="num_labels=2"):
        load_value_model(two_labels)
    legacy = tmp_path / "legacy"
    AutoModelForCausalLM.from_pretrained(tiny_preset).save_pretrained(legacy)
    save_file({"score.weight": torch.zeros(1, 8)}, str(legacy / LEGACY_VALUE_HEAD_FILE))
    with pytest.raises(ValueError, match="value_head.weight"):
        load_value_model(legacy)


def test_gradients_reach_head_and_backbone_in_bf16_too(tiny_preset):
    model = load_value_model(tiny_preset)
    per_token_values(model, _ids()).square().mean().backward()
    assert model.score.weight.grad.abs().sum() > 0 and model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
    bf16 = load_value_model(tiny_preset, dtype="bf16")
    assert bf16.score.weight.dtype == torch.bfloat16 and per_token_values(bf16, _ids()).dtype == torch.float32


def test_offline_export_config_names_the_class_a_live_export_writes(tiny_preset, tmp_path):
    """rlflow-export reads no weights: the config it writes for a value model names the class load_value_model
    builds (a causal-LM folder -> token classification; a reward model's folder -> its own class)."""
    rm = _save_classifier(AutoModelForSequenceClassification, tiny_preset, tmp_path / "rm")
    for folder in (tiny_preset, rm):
        config = value_model_export_config(folder)
        assert config.architectures == [type(load_value_model(folder)).__name__] and config.num_labels == 1
    assert value_model_export_config(tiny_preset).architectures == ["Qwen2ForTokenClassification"]
