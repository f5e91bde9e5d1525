"""``merged_peft_folder`` (the Tinker service's sampler snapshots: a saved peft folder merged over the base
model's safetensors) against peft's own ``merge_and_unload`` of the same adapters."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from rlflow.engines.common.checkpoint.lora_export import merged_peft_folder
from rlflow.errors import CheckpointError
from rlflow.models.hf_checkpoint import safetensors_weights


def test_a_saved_peft_folder_merges_like_peft_merge_and_unload(model_path, tmp_path):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=12, target_modules=["q_proj", "down_proj", "lm_head"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)  # fresh adapters (B = 0) would merge to the base model whatever the code does
    peft_model.save_pretrained(tmp_path / "adapter")
    expected = peft_model.merge_and_unload().state_dict()
    original = dict(safetensors_weights(model_path))
    merged = dict(merged_peft_folder(safetensors_weights(model_path), tmp_path / "adapter"))
    assert set(merged) == set(original)
    changed = {name for name in original if not torch.equal(merged[name], original[name])}
    assert changed == {name for name in original if name.endswith(("q_proj.weight", "down_proj.weight", "lm_head.weight"))}
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6)


def test_an_adapter_folder_of_another_model_is_refused(model_path, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(tmp_path / "adapter")
    renamed = ((name.replace("layers.0.", "layers.99."), tensor) for name, tensor in safetensors_weights(model_path))
    with pytest.raises(ValueError, match="match no weight of the base model"):
        list(merged_peft_folder(renamed, tmp_path / "adapter"))


@pytest.mark.parametrize("config_text,words", [
    ('{"r": 4, "lora_alpha"', "not valid JSON at line 1"),
    ('{"r": 0, "lora_alpha": 8}', "needs numbers 'lora_alpha' and 'r' > 0"),
    ('["r", 4]', "needs numbers 'lora_alpha' and 'r' > 0"),
])
def test_a_damaged_adapter_config_is_one_line_naming_it(model_path, tmp_path, config_text, words):
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(tmp_path / "adapter")
    (tmp_path / "adapter" / "adapter_config.json").write_text(config_text)
    with pytest.raises(CheckpointError) as error:
        list(merged_peft_folder(safetensors_weights(model_path), tmp_path / "adapter"))
    message = str(error.value)
    assert message.startswith(f"adapter config {tmp_path / 'adapter' / 'adapter_config.json'}: ") and words in message
    assert "\n" not in message
