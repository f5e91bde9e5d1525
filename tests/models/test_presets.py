"""The embedded preset: an HF folder that transformers loads, deterministic per seed, with a ChatML template."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from rlflow.models.presets import PRESET_SIZES, build_preset, count_saved_parameters, main, preset_options

USER_PROMPT = "What is 123+456? Answer with the number after ####."
SOLUTION = "123+456=579\n#### 579"


def test_preset_loads_with_auto_classes(tiny_preset):
    tokenizer = AutoTokenizer.from_pretrained(tiny_preset, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_preset, local_files_only=True)
    assert isinstance(model, Qwen2ForCausalLM)
    config = model.config
    assert config.vocab_size == len(tokenizer)
    assert config.tie_word_embeddings is False
    assert config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id
    assert tokenizer.pad_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert 0.5e6 < count_saved_parameters(tiny_preset) == sum(p.numel() for p in model.parameters()) < 1e6
    ids = tokenizer(USER_PROMPT, return_tensors="pt")["input_ids"]
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_tokenizer_round_trips_any_text_and_splits_digits(tiny_preset):
    tokenizer = AutoTokenizer.from_pretrained(tiny_preset, local_files_only=True)
    for text in [USER_PROMPT, SOLUTION, "héllo wörld ☃ \t x\r\n", "def f(x):\n    return {'a': [1, 2]}", "~`|\\^"]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("12345+678")["input_ids"])
    assert tokens == ["1", "2", "3", "4", "5", "+", "6", "7", "8"]
    # Trained on the task text: each word of the fixed prompt sentence is a single token.
    assert len(tokenizer(" Answer with the number after ####.")["input_ids"]) <= 7


def test_chat_template_is_chatml_with_generation_prompt(tiny_preset):
    tokenizer = AutoTokenizer.from_pretrained(tiny_preset, local_files_only=True)
    messages = [{"role": "user", "content": USER_PROMPT}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == f"<|im_start|>user\n{USER_PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert ids == tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")

    chat = messages + [{"role": "assistant", "content": SOLUTION}]
    out = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assistant_ids = [t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tokenizer.decode(assistant_ids) == SOLUTION + "<|im_end|>"


def test_build_is_deterministic_per_seed(tmp_path, tiny_preset):
    again = build_preset(tmp_path / "again", seed=0)
    other_seed = build_preset(tmp_path / "seed1", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (tiny_preset / name).read_bytes(), name
    assert (other_seed / "model.safetensors").read_bytes() != (tiny_preset / "model.safetensors").read_bytes()
    assert (other_seed / "tokenizer.json").read_bytes() == (tiny_preset / "tokenizer.json").read_bytes()


def test_cli_builds_the_same_bytes_and_reports_params(tmp_path, tiny_preset, capsys):
    # Each build trains the tokenizer with fresh Rust hash-map seeds, so equal bytes here also
    # cover run-to-run determinism (checked by hand across processes as well).
    out = tmp_path / "cli"
    assert main(["--out", str(out), "--seed", "0"]) == 0
    assert f"params={count_saved_parameters(out):,}" in capsys.readouterr().out
    for name in ("model.safetensors", "tokenizer.json"):
        assert (out / name).read_bytes() == (tiny_preset / name).read_bytes(), name
    assert main(["--out", str(out), "--seed", "1"]) == 2
    assert "overwrite" in capsys.readouterr().err


def test_existing_folder_is_reused_refused_or_overwritten(tmp_path):
    out = build_preset(tmp_path / "p", seed=0)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert build_preset(out, seed=0) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(FileExistsError, match="overwrite"):
        build_preset(out, seed=3)
    before = (out / "model.safetensors").read_bytes()
    build_preset(out, seed=3, overwrite=True)
    assert (out / "model.safetensors").read_bytes() != before
    assert json.loads((out / "rlflow_preset.json").read_text())["seed"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["p"]  # no temp dirs left behind

    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a complete preset"):
        build_preset(stranger)


def test_sizes_are_a_registry_with_keyword_overrides(tmp_path):
    assert {"tiny", "small", "25m"} <= set(PRESET_SIZES)
    options = preset_options("small", num_hidden_layers=1)
    assert options["hidden_size"] == PRESET_SIZES["small"].hidden_size and options["num_hidden_layers"] == 1
    with pytest.raises(ValueError, match="unknown preset size"):
        preset_options("huge")
    with pytest.raises(ValueError, match="unknown preset option"):
        preset_options("tiny", hidden=3)
    folder = build_preset(tmp_path / "custom", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["tie_word_embeddings"]) == (64, 1, True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
