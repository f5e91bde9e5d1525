"""The embedded models: small Qwen2, Qwen3 and Llama LMs plus a locally trained tokenizer.

``build_preset(out_dir, corpus, preset="tiny", seed=0)`` writes a normal Hugging Face folder
(config.json, model.safetensors, generation_config.json, tokenizer files with a ChatML chat
template) that ``AutoModelForCausalLM`` / ``AutoTokenizer`` and vLLM load like any checkpoint.
Nothing is downloaded: the weights are a seeded random init and the tokenizer is trained here on
``corpus`` (lines of text; rlflow's own is ``rlflow.data.tasks.corpus.tokenizer_corpus()``).
Every preset shares that tokenizer; ``PRESETS`` names the architecture and shape of each.

Choices:
- ``tiny`` (the demo's model) keeps untied input/output embeddings, so every engine, HF export
  and weight-sync path sees an explicit ``lm_head.weight``; the ``tiny-qwen2``/``tiny-qwen3``
  presets tie them, as the small Qwen checkpoints do.
- The ``tiny-*`` presets have 4 layers, which split evenly into 2 or 4 pipeline stages; any
  preset takes ``num_hidden_layers=N`` (and the other ``PRESET_DEFAULTS`` fields) as an override.
- ``head_dim`` >= 32 in every preset (the smallest vLLM's CPU attention supports).
- Float32 weights; the same preset, seed, options and corpus give byte-identical
  ``model.safetensors`` and ``tokenizer.json``.

Command line (in the data layer, which supplies the corpus): ``python -m rlflow.data.presets``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import GenerationConfig

from rlflow.models.preset_architectures import PRESET_ARCHITECTURE_REGISTRY
from rlflow.models.tokenizer_builder import IM_END, PAD_TOKEN, train_tokenizer
from rlflow.utils.text_files import FileFormatError, read_json

PRESET_MARKER = "rlflow_preset.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", PRESET_MARKER)
# Positive integer options; the model's vocab_size is checked by the tokenizer trainer.
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings")


@dataclass(frozen=True)
class Preset:
    """One named preset: its architecture (a ``PRESET_ARCHITECTURE_REGISTRY`` name) and shape."""

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool


PRESETS: dict[str, Preset] = {
    # ~0.7M parameters, 3 layers: the CPU demo and most unit tests. Its bytes are pinned by a test.
    "tiny": Preset("qwen2", 128, 384, 3, 4, 2, 32, tie_word_embeddings=False),
    # ~3.3M parameters: a model that can learn the synthetic tasks in minutes on CPU.
    "small": Preset("qwen2", 256, 768, 4, 8, 4, 32, tie_word_embeddings=False),
    # ~25M parameters: benchmarks.
    "25m": Preset("qwen2", 512, 1536, 8, 8, 4, 64, tie_word_embeddings=False),
    # ~358M parameters: Qwen2.5-0.5B's layer shapes (hidden 896, 24 layers, GQA 14:2, tied embeddings)
    # with rlflow's small vocabulary: GPU benches (bench/gpu_check.sh).
    "500m": Preset("qwen2", 896, 4864, 24, 14, 2, 64, tie_word_embeddings=True),
    # 4 layers (2 or 4 pipeline stages), GQA 4:2, tiny widths: one per architecture.
    "tiny-qwen2": Preset("qwen2", 128, 384, 4, 4, 2, 32, tie_word_embeddings=True),
    "tiny-qwen3": Preset("qwen3", 128, 384, 4, 4, 2, 32, tie_word_embeddings=True),
    "tiny-llama": Preset("llama", 128, 384, 4, 4, 2, 32, tie_word_embeddings=False),
}

# Config fields every preset shares; each can be overridden by a keyword of build_preset.
PRESET_DEFAULTS: dict[str, Any] = {
    # Upper bound for the BPE trainer; the model's vocab_size is the trained tokenizer's exact
    # length (about 350 with rlflow's corpus, as it runs out of frequent pairs), so no logit is
    # a token id that the tokenizer cannot decode.
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
}


def preset_options(preset: str = "tiny", **overrides: Any) -> dict[str, Any]:
    """The full option dict of ``preset`` with ``overrides`` applied; bad names or shapes raise ValueError."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; presets: {sorted(PRESETS)}")
    options = {**dataclasses.asdict(PRESETS[preset]), **PRESET_DEFAULTS}
    unknown = sorted(set(overrides) - set(options))
    if unknown:
        raise ValueError(f"unknown preset option(s) {unknown}; options: {sorted(options)}")
    options.update(overrides)
    _check_options(options)
    return options


def _check_options(options: dict[str, Any]) -> None:
    PRESET_ARCHITECTURE_REGISTRY.get(options["architecture"])
    for name in SHAPE_FIELDS:
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"preset option {name} must be a positive integer, got {value!r}")
    if options["num_attention_heads"] % options["num_key_value_heads"]:
        raise ValueError(f"num_attention_heads ({options['num_attention_heads']}) must be a multiple of "
                         f"num_key_value_heads ({options['num_key_value_heads']})")


def build_preset(
    out_dir: str | Path,
    corpus: Iterable[str],
    preset: str = "tiny",
    seed: int = 0,
    overwrite: bool = False,
    **overrides: Any,
) -> Path:
    """Build ``preset`` into ``out_dir``, its tokenizer trained on ``corpus``, and return the path.

    ``overrides`` replace fields of the preset (``architecture``, ``num_hidden_layers``, ...) or
    of ``PRESET_DEFAULTS``. An existing folder built with the same preset, seed, options and
    corpus is returned unchanged unless ``overwrite``; one built otherwise, or a non-empty folder
    that is not a preset, raises ``FileExistsError``. The folder is written to a temp dir and
    renamed into place.
    """
    out = Path(out_dir)
    lines = list(corpus)
    if not lines:
        raise ValueError("the tokenizer corpus is empty; pass lines of text, e.g. "
                         "rlflow.data.tasks.corpus.tokenizer_corpus()")
    spec = {"preset": preset, "seed": seed, "options": preset_options(preset, **overrides),
            "corpus_sha256": corpus_fingerprint(lines)}
    if not overwrite and _reuse_existing(out, spec):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)
        _write_preset(tmp, spec, lines)
        _replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def corpus_fingerprint(lines: Iterable[str]) -> str:
    """SHA-256 of the corpus lines (each line's bytes followed by a NUL)."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8") + b"\0")
    return digest.hexdigest()


def count_saved_parameters(folder: str | Path) -> int:
    """Number of parameters stored in ``folder/model.safetensors`` (read from its header only)."""
    with safe_open(str(Path(folder) / "model.safetensors"), framework="pt") as weights:
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())


def _reuse_existing(out: Path, spec: dict[str, Any]) -> bool:
    """True if ``out`` already holds this exact preset; raises if it holds something else."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return False
    missing = [name for name in REQUIRED_FILES if not (out / name).is_file()]
    if missing:
        raise FileExistsError(f"{out} exists but is not a complete preset (missing {missing}); pass overwrite=True "
                              "(--overwrite) to replace it, or choose another folder")
    marker = read_json(out / PRESET_MARKER, error=FileFormatError, what="preset marker")
    built = _with_recorded_defaults(marker if isinstance(marker, dict) else {}, spec)
    if built != spec:
        raise FileExistsError(f"{out} holds a preset built with {built}, not the requested {spec}; pass "
                              "overwrite=True (--overwrite) to rebuild it")
    return True


def _with_recorded_defaults(built: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A marker written before the architecture and the corpus were recorded, read as the build it was.

    Such folders were all Qwen2 and built from the default task corpus, which ``spec`` names
    when the caller passes that corpus, so a folder from an earlier rlflow is reused, not refused.
    """
    if "corpus_sha256" in built:
        return built
    options = {"architecture": "qwen2", **built.get("options", {})}
    return {**built, "options": options, "corpus_sha256": spec["corpus_sha256"]}


def _write_preset(folder: Path, spec: dict[str, Any], corpus: list[str]) -> None:
    options = dict(spec["options"])
    build_model = PRESET_ARCHITECTURE_REGISTRY.get(options.pop("architecture"))
    tokenizer = train_tokenizer(corpus, vocab_size=options["vocab_size"],
                                model_max_length=options["max_position_embeddings"])
    options["vocab_size"] = len(tokenizer)
    eos_id, pad_id = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        model = build_model({**options, "bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": pad_id})
        model = model.to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, bos_token_id=None)
    model.save_pretrained(folder)
    # The chat template goes inside tokenizer_config.json (readable by every transformers version).
    tokenizer.save_pretrained(folder, save_jinja_files=False)
    _set_tokenizer_class(folder / "tokenizer_config.json", "Qwen2Tokenizer")
    (folder / PRESET_MARKER).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")


def _set_tokenizer_class(tokenizer_config: Path, class_name: str) -> None:
    """Name the tokenizer class that transformers 4 and 5 both map to a tokenizer.json-backed class.

    Every architecture's folder names ``Qwen2Tokenizer``: the tokenizer is Qwen2's byte-level BPE
    whatever the model, and ``LlamaTokenizer`` would rebuild a different (SentencePiece-style)
    pre-tokenizer.
    """
    data = json.loads(tokenizer_config.read_text())
    data["tokenizer_class"] = class_name
    tokenizer_config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _replace_dir(new: Path, out: Path) -> None:
    """Move ``new`` to ``out``; an existing ``out`` is moved aside first and deleted after."""
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(new, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, out)


if __name__ == "__main__":
    # The command moved with the corpus it needs; say so instead of exiting 0 having built nothing.
    raise SystemExit("error: build presets with `python -m rlflow.data.presets --out DIR [--preset NAME]`")
