"""The embedded default model: a small Qwen2-architecture LM plus a locally trained tokenizer.

``build_preset(out_dir, size="tiny", seed=0)`` writes a normal Hugging Face folder
(config.json, model.safetensors, generation_config.json, tokenizer files with a ChatML chat
template) that ``AutoModelForCausalLM`` / ``AutoTokenizer`` and vLLM load like any checkpoint.
Nothing is downloaded: the weights are a seeded random init and the tokenizer is trained here.

Choices:
- Untied input/output embeddings (``tie_word_embeddings=False``): every engine, HF export and
  weight-sync path then sees an explicit ``lm_head.weight`` with no tied-parameter special case.
  It costs ``vocab x hidden`` parameters; pass ``tie_word_embeddings=True`` to change it.
- ``head_dim = hidden_size / num_attention_heads`` in every named size (>= 32, which vLLM's CPU
  attention supports).
- Float32 weights; same seed and options give byte-identical ``model.safetensors`` and
  ``tokenizer.json``.

Command line: ``python -m rlflow.models.presets --out DIR [--size tiny] [--seed 0] [--overwrite]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from rlflow.models.tokenizer_builder import IM_END, PAD_TOKEN, train_tokenizer

PRESET_MARKER = "rlflow_preset.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", PRESET_MARKER)


@dataclass(frozen=True)
class PresetSize:
    """The shape of one named preset size (a Qwen2 config's size fields)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


PRESET_SIZES: dict[str, PresetSize] = {
    # ~0.7M parameters: unit tests, the CPU demo.
    "tiny": PresetSize(128, 384, 3, 4, 2, 32),
    # ~3.3M parameters: a model that can learn the synthetic tasks in minutes on CPU.
    "small": PresetSize(256, 768, 4, 8, 4, 32),
    # ~25M parameters: benchmarks.
    "25m": PresetSize(512, 1536, 8, 8, 4, 64),
}

# Config fields every size shares; each can be overridden by a keyword of build_preset.
DEFAULT_CONFIG: dict[str, Any] = {
    # Upper bound for the BPE trainer; the model's vocab_size is the trained tokenizer's exact
    # length (about 350 here, as the corpus runs out of frequent pairs), so no logit is a
    # token id that the tokenizer cannot decode.
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
}


def preset_options(size: str = "tiny", **overrides: Any) -> dict[str, Any]:
    """The full option dict for ``size`` with ``overrides`` applied; unknown names raise ValueError."""
    if size not in PRESET_SIZES:
        raise ValueError(f"unknown preset size {size!r}; sizes: {sorted(PRESET_SIZES)}")
    options = {**dataclasses.asdict(PRESET_SIZES[size]), **DEFAULT_CONFIG}
    unknown = sorted(set(overrides) - set(options))
    if unknown:
        raise ValueError(f"unknown preset option(s) {unknown}; options: {sorted(options)}")
    options.update(overrides)
    return options


def build_preset(
    out_dir: str | Path, size: str = "tiny", seed: int = 0, overwrite: bool = False, **overrides: Any
) -> Path:
    """Build the preset into ``out_dir`` and return its path.

    ``overrides`` replace fields of the size (``hidden_size``, ``num_hidden_layers``, ...) or
    of ``DEFAULT_CONFIG``. An existing folder built with the same spec is returned unchanged
    unless ``overwrite``; one built with a different spec, or a non-empty folder that is not a
    preset, raises ``FileExistsError``. The folder is written to a temp dir and renamed into place.
    """
    out = Path(out_dir)
    spec = {"size": size, "seed": seed, "options": preset_options(size, **overrides)}
    if not overwrite and _reuse_existing(out, spec):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)
        _write_preset(tmp, spec)
        _replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


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
    built = json.loads((out / PRESET_MARKER).read_text())
    if built != spec:
        raise FileExistsError(f"{out} holds a preset built with {built}, not the requested {spec}; pass "
                              "overwrite=True (--overwrite) to rebuild it")
    return True


def _write_preset(folder: Path, spec: dict[str, Any]) -> None:
    options = dict(spec["options"])
    tokenizer = train_tokenizer(vocab_size=options["vocab_size"], model_max_length=options["max_position_embeddings"])
    options["vocab_size"] = len(tokenizer)
    eos_id, pad_id = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen2Config(
        **options,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, bos_token_id=None)
    model.save_pretrained(folder)
    # The chat template goes inside tokenizer_config.json (readable by every transformers version).
    tokenizer.save_pretrained(folder, save_jinja_files=False)
    _set_tokenizer_class(folder / "tokenizer_config.json", "Qwen2Tokenizer")
    (folder / PRESET_MARKER).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")


def _set_tokenizer_class(tokenizer_config: Path, class_name: str) -> None:
    """Name the tokenizer class that transformers 4 and 5 both map to a tokenizer.json-backed class."""
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


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: build a preset and print its parameter count and path."""
    parser = argparse.ArgumentParser(prog="python -m rlflow.models.presets", description="Build the embedded preset model.")
    parser.add_argument("--out", required=True, help="output folder (a Hugging Face checkpoint folder)")
    parser.add_argument("--size", default="tiny", choices=sorted(PRESET_SIZES), help="named size")
    parser.add_argument("--seed", type=int, default=0, help="weight-init seed")
    parser.add_argument("--overwrite", action="store_true", help="rebuild even if the folder exists")
    args = parser.parse_args(argv)
    try:
        path = build_preset(args.out, size=args.size, seed=args.seed, overwrite=args.overwrite)
    except (FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"preset size={args.size} seed={args.seed} params={count_saved_parameters(path):,} path={path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
