"""The embedded tiny preset: an HF folder that transformers loads, pinned bytes, deterministic per seed, ChatML."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from rlflow.data.presets import main
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import PRESETS, build_preset, count_saved_parameters, preset_options
from rlflow.utils.text_files import FileFormatError

USER_PROMPT = "What is 123+456? Answer with the number after ####."
SOLUTION = "123+456=579\n#### 579"

# SHA-256 of the tiny preset at seed 0, computed before presets had an architecture axis: the
# demo's calibration (docs/demo.md) depends on these exact weights and token ids. JSON files are
# hashed as sorted-key JSON without ``transformers_version``; weights as name, shape and raw bytes.
TINY_SEED0_SHA256 = {
    "config.json": "ee623f280561b292c3d324f7b7daec83ccc4c9fbb12a681e20d78f9b7b607e3f",
    "generation_config.json": "b0e86da6f6759f4e0635cbfa657823ad2f3cfb9e9b842b8abb7b4fd4cc5364a6",
    "tokenizer.json": "5c301a3b7c7b667ba7d74bf9140ac12b73d0d1333de8eacc448d0ad194acf929",
    "tokenizer_config.json": "6d4d9deb7dff11f702406c02cf0be6cb8afb0a6b9eaef91e99cb4a7a8c61c1ea",
    "weights": "d82ca13fca059723bfa4fdd6505a0b8732995a9fb0ac050041aa2ca9c6e72719",
}


def _preset_sha256(folder) -> dict[str, str]:
    digests = {}
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        data = json.loads((folder / name).read_text())
        data.pop("transformers_version", None)
        digests[name] = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    weights = hashlib.sha256()
    with safe_open(str(folder / "model.safetensors"), framework="pt") as tensors:
        for key in sorted(tensors.keys()):
            tensor = tensors.get_tensor(key)
            weights.update(key.encode() + str(tuple(tensor.shape)).encode() + tensor.contiguous().numpy().tobytes())
    digests["weights"] = weights.hexdigest()
    return digests


def test_tiny_preset_bytes_are_pinned(tiny_preset):
    assert _preset_sha256(tiny_preset) == TINY_SEED0_SHA256


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
    again = build_preset(tmp_path / "again", tokenizer_corpus(), seed=0)
    other_seed = build_preset(tmp_path / "seed1", tokenizer_corpus(), seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (tiny_preset / name).read_bytes(), name
    assert (other_seed / "model.safetensors").read_bytes() != (tiny_preset / "model.safetensors").read_bytes()
    assert (other_seed / "tokenizer.json").read_bytes() == (tiny_preset / "tokenizer.json").read_bytes()


def test_cli_builds_the_same_bytes_and_reports_params(tmp_path, tiny_preset, capsys):
    # Each build trains the tokenizer with fresh Rust hash-map seeds, so equal bytes here also
    # cover run-to-run determinism (checked by hand across processes as well).
    out = tmp_path / "cli"
    assert main(["--out", str(out), "--seed", "0"]) == 0
    assert f"preset tiny (qwen2, 3 layers) seed=0 params={count_saved_parameters(out):,}" in capsys.readouterr().out
    for name in ("model.safetensors", "tokenizer.json"):
        assert (out / name).read_bytes() == (tiny_preset / name).read_bytes(), name
    assert main(["--out", str(out), "--seed", "1"]) == 2
    assert "overwrite" in capsys.readouterr().err


def test_existing_folder_is_reused_refused_or_overwritten(tmp_path):
    out = build_preset(tmp_path / "p", tokenizer_corpus(), seed=0)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert build_preset(out, tokenizer_corpus(), seed=0) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(FileExistsError, match="overwrite"):
        build_preset(out, tokenizer_corpus(), seed=3)
    with pytest.raises(FileExistsError, match="corpus_sha256"):  # same preset and seed, other tokenizer text
        build_preset(out, ["other text\n", "for the tokenizer\n"], seed=0)
    before = (out / "model.safetensors").read_bytes()
    build_preset(out, tokenizer_corpus(), seed=3, overwrite=True)
    assert (out / "model.safetensors").read_bytes() != before
    assert json.loads((out / "rlflow_preset.json").read_text())["seed"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["p"]  # no temp dirs left behind

    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a complete preset"):
        build_preset(stranger, tokenizer_corpus())
    with pytest.raises(ValueError, match="corpus is empty"):
        build_preset(tmp_path / "empty", [])


def test_a_folder_built_before_the_marker_recorded_architecture_and_corpus_is_reused(tmp_path):
    out = build_preset(tmp_path / "p", tokenizer_corpus(), seed=0)
    marker = out / "rlflow_preset.json"
    old = json.loads(marker.read_text())
    del old["corpus_sha256"], old["options"]["architecture"]
    marker.write_text(json.dumps(old))
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert build_preset(out, tokenizer_corpus(), seed=0) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(FileExistsError, match="overwrite"):  # still refused when the options differ
        build_preset(out, tokenizer_corpus(), seed=1)


def test_presets_are_a_registry_with_keyword_overrides(tmp_path):
    assert {"tiny", "small", "25m", "tiny-qwen2", "tiny-qwen3", "tiny-llama"} <= set(PRESETS)
    options = preset_options("small", num_hidden_layers=1)
    assert options["hidden_size"] == PRESETS["small"].hidden_size and options["num_hidden_layers"] == 1
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        preset_options("huge")
    with pytest.raises(ValueError, match="unknown preset option"):
        preset_options("tiny", hidden=3)
    folder = build_preset(tmp_path / "custom", tokenizer_corpus(), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["tie_word_embeddings"]) == (64, 1, True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_a_damaged_preset_marker_is_one_line_naming_it(tmp_path):
    out = build_preset(tmp_path / "p", tokenizer_corpus(), seed=0)
    (out / "rlflow_preset.json").write_text('{"preset": "tiny", "seed"')
    with pytest.raises(FileFormatError, match=r"^preset marker .*rlflow_preset\.json: not valid JSON at line 1.*cut off"):
        build_preset(out, tokenizer_corpus(), seed=0)
