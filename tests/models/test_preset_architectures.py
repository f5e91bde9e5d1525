"""The Qwen2, Qwen3 and Llama presets: each loads as its HF class with its claimed features and the shared tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset, count_saved_parameters, preset_options

# What each preset claims (docs/quickstart.md), checked against the saved folder.
CLAIMS = {
    "tiny-qwen2": dict(model_cls=Qwen2ForCausalLM, tied=True, qkv_bias=True, qk_norm=False),
    "tiny-qwen3": dict(model_cls=Qwen3ForCausalLM, tied=True, qkv_bias=False, qk_norm=True),
    "tiny-llama": dict(model_cls=LlamaForCausalLM, tied=False, qkv_bias=False, qk_norm=False),
}
TEXTS = ["What is 7+5-3+8? Answer with the number after ####.", "7+5=12\n12-3=9\n#### 17", "héllo ☃ \t{'a': [1]}"]


def _saved_names(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        return set(weights.keys())


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_preset_loads_as_its_architecture_with_its_features(name, architecture_presets):
    claims, folder = CLAIMS[name], architecture_presets[name]
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    config, saved = model.config, _saved_names(folder)
    assert type(model) is claims["model_cls"]
    layers = config.num_hidden_layers
    assert layers == len(model.model.layers) == 4 and layers % 2 == 0 and layers % 4 == 0  # 2 or 4 pipeline stages
    # Grouped-query attention: 4 query heads share 2 key/value heads of width 32.
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 32)
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.out_features == 4 * 32
    assert attention.k_proj.out_features == attention.v_proj.out_features == 2 * 32
    # Tied embeddings: one tensor in memory, no lm_head.weight on disk.
    assert config.tie_word_embeddings is claims["tied"]
    assert ("lm_head.weight" not in saved) is claims["tied"]
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) is claims["tied"]
    for layer in range(layers):
        prefix = f"model.layers.{layer}.self_attn."
        assert ({prefix + p + ".bias" for p in ("q_proj", "k_proj", "v_proj")} <= saved) is claims["qkv_bias"]
        assert any(prefix + p + ".bias" in saved for p in ("q_proj", "k_proj", "v_proj")) is claims["qkv_bias"]
        assert ({prefix + "q_norm.weight", prefix + "k_norm.weight"} <= saved) is claims["qk_norm"]
    assert sum(p.numel() for p in model.parameters()) == count_saved_parameters(folder)
    ids = torch.tensor([[1, 282, 201, 296, 284]])
    assert torch.isfinite(model(ids).logits).all()


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_every_architecture_shares_the_tiny_tokenizer(name, architecture_presets, tiny_preset):
    folder = architecture_presets[name]
    assert (folder / "tokenizer.json").read_bytes() == (tiny_preset / "tokenizer.json").read_bytes()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    reference = AutoTokenizer.from_pretrained(tiny_preset, local_files_only=True)
    assert type(tokenizer) is type(reference)
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == reference(text)["input_ids"]
    chat = [{"role": "user", "content": TEXTS[0]}, {"role": "assistant", "content": TEXTS[1]}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == reference.apply_chat_template(chat, tokenize=False)
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == len(tokenizer)
    assert config["eos_token_id"] == tokenizer.eos_token_id and config["pad_token_id"] == tokenizer.pad_token_id


def test_same_seed_same_bytes_for_every_architecture(architecture_presets, tmp_path):
    for name, folder in architecture_presets.items():
        again = build_preset(tmp_path / name, tokenizer_corpus(), name, seed=0)
        assert (again / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes(), name


def test_layer_count_and_architecture_are_overridable_and_checked(tmp_path):
    folder = build_preset(tmp_path / "llama8", tokenizer_corpus(), "tiny-llama", num_hidden_layers=8)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert isinstance(model, LlamaForCausalLM) and len(model.model.layers) == 8
    assert preset_options("tiny", architecture="qwen3")["architecture"] == "qwen3"
    with pytest.raises(ValueError, match="num_hidden_layers must be a positive integer"):
        preset_options("tiny-qwen3", num_hidden_layers=0)
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        preset_options("tiny-qwen3", num_key_value_heads=3)
    with pytest.raises(ValueError, match="unknown preset architecture 'gpt2'.*llama, qwen2, qwen3"):
        preset_options("tiny", architecture="gpt2")
