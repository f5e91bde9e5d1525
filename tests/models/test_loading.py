"""Loaders for local HF folders: Qwen2/Qwen3/Llama load exactly, dtypes resolve, bad folders fail clearly."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from rlflow.models.loading import load_causal_lm, load_tokenizer, load_value_model, resolve_dtype
from rlflow.models.value_models import per_token_values

_SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)
ARCHITECTURES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}


def _save_random(arch: str, folder) -> torch.nn.Module:
    config_cls, model_cls = ARCHITECTURES[arch]
    torch.manual_seed(0)
    model = model_cls(config_cls(**_SHAPE, head_dim=16)).eval()
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_architectures_load_with_identical_logits(arch, tmp_path):
    reference = _save_random(arch, tmp_path)
    ids = torch.randint(0, _SHAPE["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    loaded = load_causal_lm(tmp_path, dtype="fp32").eval()  # sdpa, like the reference
    eager = load_causal_lm(tmp_path, dtype="fp32", attn_implementation="eager").eval()
    assert type(loaded) is type(reference)
    assert eager.config._attn_implementation == "eager"
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, reference(ids).logits, rtol=0, atol=0)
        torch.testing.assert_close(eager(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-6)
        values = per_token_values(load_value_model(tmp_path), ids)
    assert values.shape == (2, 9)
    bf16 = load_causal_lm(tmp_path, dtype="bf16")
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}


def test_resolve_dtype_names():
    assert resolve_dtype("float32") is torch.float32 and resolve_dtype("fp32") is torch.float32
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("torch.bfloat16") is torch.bfloat16
    assert resolve_dtype("fp16") is torch.float16 and resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="bfloat16"):
        resolve_dtype("float8")


def test_missing_or_invalid_folders_say_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_causal_lm(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_causal_lm(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(FileNotFoundError, match="no weights"):
        load_value_model(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_architecture"}))
    with pytest.raises(ValueError, match="could not load a model"):
        load_causal_lm(tmp_path)
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_tokenizer(tmp_path)


def test_load_tokenizer_reads_the_preset_and_fills_a_missing_pad(tiny_preset, tmp_path):
    assert load_tokenizer(tiny_preset).pad_token == "<|endoftext|>"
    vocab = {"<eos>": 0, "a": 1, "b": 2}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>").save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.pad_token == "<eos>" and tokenizer.pad_token_id == 0
