"""``rlflow-export CKPT OUT``: a Hugging Face folder from an engine checkpoint, on one process, without Ray.

``CKPT`` is any of:

* a run folder (``trainer.default_local_dir``): its newest loadable ``global_step_N``;
* a ``global_step_N`` folder of a PPO or SFT run: the engine checkpoint of ``--role``
  (default: ``actor``, or the only one there is, e.g. SFT's ``engine``);
* an engine checkpoint folder (the one holding ``engine_meta.json``).

The weights are read from the checkpoint's sharded DCP state whatever world size and engine
(fsdp, fsdp2, torchtitan, ...) wrote it (``checkpoint_reader``), and named as HF names by that
engine's class (``BaseEngine.checkpoint_hf_tensors``); config and tokenizer files come from the
checkpoint's ``hf_config/`` or ``--model-path``; tied weights are written once, as
``save_pretrained`` and the engines' ``save_hf`` write them. A LoRA checkpoint (it holds the adapters
and their ``adapter_config.json``, not the base weights) becomes a peft adapter folder that
``PeftModel.from_pretrained`` loads on its base model. ``OUT`` is written atomically and replaced only
when it is missing, empty or an earlier rlflow export. Bad input: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlflow.engines import BaseEngine, ENGINE_REGISTRY
from rlflow.engines.common.checkpoint.checkpoint_reader import read_model_weights
from rlflow.engines.common.checkpoint.checkpointing import HF_CONFIG_DIR, META_FILE, read_meta, resolve_checkpoint_dir
from rlflow.engines.common.checkpoint.hf_export import EXPORT_MARKER, write_hf_folder, write_peft_adapter_folder
from rlflow.engines.common.checkpoint.lora_export import adapter_tensors
from rlflow.engines.common.forward.lora import ADAPTER_CONFIG_FILE
from rlflow.engines.common.forward.models import MODEL_KIND_REGISTRY
from rlflow.errors import CheckpointError, UserError
from rlflow.trainer.checkpoint import DRIVER_STATE, CheckpointManager
from rlflow.trainer.checkpoint_manifest import manifest_problem
from rlflow.utils.output_paths import check_output_folder

__all__ = ["export_checkpoint", "main"]

DEFAULT_ROLE = "actor"


class ExportError(UserError):
    """The export's output folder or model files are unusable."""


def _engine_checkpoints(step_dir: Path) -> list[str]:
    return sorted(child.name for child in step_dir.iterdir() if (child / META_FILE).is_file())


def _step_folder(path: Path) -> Path:
    """``path`` itself if it is a ``global_step_N`` folder, else the newest loadable one of the run folder ``path``."""
    if (path / DRIVER_STATE).is_file():
        problem = manifest_problem(path)
        if problem is not None:
            raise CheckpointError(f"checkpoint {path} is damaged: {problem}")
        return path
    latest = CheckpointManager(path).latest()
    if latest is None:
        raise CheckpointError(
            f"{path} is not a checkpoint: no {META_FILE} (engine checkpoint), no {DRIVER_STATE} (global_step_N folder) "
            f"and no complete global_step_N inside (run folder)"
        )
    return latest


def _engine_folder(path: Path, role: Optional[str]) -> Path:
    """The engine checkpoint folder that ``path`` (+ ``role``) names."""
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if role is None and (path / META_FILE).is_file():
        return path
    step_dir = _step_folder(path)
    roles = _engine_checkpoints(step_dir)
    chosen = role or (DEFAULT_ROLE if DEFAULT_ROLE in roles else roles[0] if len(roles) == 1 else None)
    if chosen not in roles:
        wanted = f"--role {chosen}" if chosen else "a --role"
        raise CheckpointError(f"checkpoint {step_dir}: {wanted} is needed; its engine checkpoints are {roles or 'none'}")
    return resolve_checkpoint_dir(step_dir / chosen)


def _model_files(folder: Path, model_path: Optional[Path]) -> Path:
    source = model_path or folder / HF_CONFIG_DIR
    if not (source / "config.json").is_file():
        how = "the model folder given by --model-path" if model_path else f"{HF_CONFIG_DIR}/ (written by older rlflow versions without it)"
        raise ExportError(f"no config.json in {source}: {how}; pass --model-path <the HF folder the run started from>")
    return source


def _tied_copies(source: Path) -> set[str]:
    """HF names that tie to another weight in the model of ``source`` (the LM head of tied embeddings).

    The checkpoint's state dict holds them under both names; the live export (``named_parameters``)
    and ``save_pretrained`` write them once, and so does this one. Found on a meta-device model: no memory.
    """
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ExportError(f"cannot read the model config in {source}: {str(error).splitlines()[0]}") from None
    if not getattr(config, "tie_word_embeddings", False):
        return set()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}


def _engine_class(name: Optional[str]) -> type[BaseEngine]:
    """The engine class that wrote a checkpoint (its state names); an engine not registered in this
    process (a plugin) is read with the HF module's naming, the base contract's default."""
    return ENGINE_REGISTRY.get(name) if name in ENGINE_REGISTRY.names() else BaseEngine


def _check_out(out: Path) -> None:
    check_output_folder(out, "OUT", ExportError)
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_MARKER).is_file():
        raise ExportError(f"OUT {out} holds files rlflow did not export (no {EXPORT_MARKER}); name an empty or new folder")


def export_checkpoint(checkpoint: Path, out: Path, role: Optional[str] = None, model_path: Optional[Path] = None) -> Path:
    """Write the HF folder ``out`` from ``checkpoint`` (see the module doc); returns the engine folder read."""
    _check_out(out)  # before any checkpoint file is read
    folder = _engine_folder(checkpoint, role)
    meta = read_meta(folder)
    model_kind = meta.get("model_kind")
    if model_kind not in MODEL_KIND_REGISTRY:
        raise CheckpointError(f"checkpoint {folder}: model kind {model_kind!r} is not one of {MODEL_KIND_REGISTRY.names()}")
    if (folder / ADAPTER_CONFIG_FILE).is_file():  # a LoRA checkpoint: the adapters alone, as a peft folder
        write_peft_adapter_folder(out, adapter_tensors(read_model_weights(folder)), (folder / ADAPTER_CONFIG_FILE).read_text())
        return folder
    source = _model_files(folder, model_path)
    tied = _tied_copies(source)
    hf_tensors = _engine_class(meta.get("engine")).checkpoint_hf_tensors(read_model_weights(folder), source)
    weights = [(name, tensor) for name, tensor in hf_tensors if name not in tied]
    folder_config = MODEL_KIND_REGISTRY.get(model_kind).folder_export_config
    write_hf_folder(out, weights, source, folder_config(source) if folder_config else None)
    return folder


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlflow-export", description=__doc__.split("\n", 1)[0])
    parser.add_argument("checkpoint", type=Path, help="run folder, global_step_N folder or engine checkpoint folder")
    parser.add_argument("out", type=Path, help="the HF folder to write (missing, empty or an earlier rlflow export)")
    parser.add_argument("--role", help=f"engine checkpoint inside global_step_N (default: {DEFAULT_ROLE} or the only one)")
    parser.add_argument("--model-path", type=Path, help=f"config/tokenizer source for checkpoints without {HF_CONFIG_DIR}/")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Console script ``rlflow-export``; returns the exit status (2: bad input, one line on stderr)."""
    args = _parser().parse_args(argv)
    try:
        folder = export_checkpoint(args.checkpoint, args.out, args.role, args.model_path)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"exported {folder} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
