"""What the run-level keys ask for, checked before anything is created: nothing the user set is silently ignored.

* ``trainer.resume_from_path`` is read only under ``trainer.resume_mode=path``; set under any other
  mode it would be ignored (a run from scratch where the user asked for a resume), so it is refused.
* The export folders (``trainer.export_hf_dir``, ``trainer.export_lora_adapter_dir``) are replaced
  at the end of a run: one equal to the run folder, holding it, or inside one of its checkpoints
  (``global_step_*``) would replace or be pruned with them, and two equal export folders would
  replace each other, so these are refused. A subfolder of the run folder of another name (the
  default ``<run folder>/hf``, the LoRA recipe's ``<run folder>/adapter``) is fine.
* A checkpoint to resume must be of the model this run trains: ``check_same_architecture`` compares
  the ``config.json`` the checkpoint stored (``<role>/hf_config``) with the model folder's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from rlflow.config import ConfigError
from rlflow.engines.common.checkpoint.checkpointing import HF_CONFIG_DIR
from rlflow.errors import CheckpointError
from rlflow.utils.text_files import read_json

CHECKPOINT_PREFIX = "global_step_"  # CheckpointManager's folders (global_step_N, global_step_N.partial)
EXPORT_KEYS = ("trainer.export_hf_dir", "trainer.export_lora_adapter_dir")
POLICY_ROLES = ("actor", "engine")  # the policy's engine checkpoint in a PPO / SFT global_step_N folder
# config.json keys that fix the shapes of the weights: a checkpoint differing in one cannot be loaded.
ARCHITECTURE_KEYS = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings")


def _export_conflict(export: Path, run: Path) -> Optional[str]:
    """Why an export into ``export`` would hit the run folder ``run``, or None."""
    if export == run or export in run.parents:
        return f"is {'the run folder' if export == run else 'a folder holding the run folder'} " \
               f"trainer.default_local_dir={run}, which the export would replace with its checkpoints"
    if run in export.parents and export.relative_to(run).parts[0].startswith(CHECKPOINT_PREFIX):
        return f"is inside the checkpoint {run / export.relative_to(run).parts[0]}, which a save or prune replaces"
    return None


def check_run_intent(config: Any) -> None:
    """Refuse ``resume_from_path`` without ``resume_mode=path``, and export folders that would hit the run folder
    or each other."""
    trainer = config.trainer
    if trainer.resume_from_path and trainer.resume_mode != "path":
        raise ConfigError(f"config key 'trainer.resume_from_path': set, but trainer.resume_mode={trainer.resume_mode} does "
                          "not read it (the run would not resume from it); add trainer.resume_mode=path, or drop the key")
    run = Path(trainer.default_local_dir).expanduser().resolve()
    exports: dict[Path, str] = {}
    for key in EXPORT_KEYS:
        value: Optional[str] = OmegaConf.select(config, key, default=None)
        if not value:
            continue
        export = Path(value).expanduser().resolve()
        conflict = _export_conflict(export, run) or (f"is also {exports[export]}, and each export replaces the folder"
                                                     if export in exports else None)
        if conflict:
            raise ConfigError(f"config key '{key}': {value} {conflict}; name another folder")
        exports[export] = key


def _architecture(config_file: Path) -> dict[str, Any]:
    config = read_json(config_file, CheckpointError, "model config")
    return {key: config.get(key) for key in ARCHITECTURE_KEYS} if isinstance(config, dict) else {}


def check_same_architecture(checkpoint: Path, model_path: Path) -> None:
    """``CheckpointError`` naming the keys when the policy checkpoint in ``checkpoint`` (a ``global_step_N`` folder)
    stored a ``config.json`` whose architecture differs from ``model_path``'s; nothing to compare is no error."""
    model_config = Path(model_path) / "config.json"
    stored = next((checkpoint / role / HF_CONFIG_DIR / "config.json" for role in POLICY_ROLES
                   if (checkpoint / role / HF_CONFIG_DIR / "config.json").is_file()), None)
    if stored is None or not model_config.is_file():
        return
    ours, theirs = _architecture(model_config), _architecture(stored)
    differences = [f"{key}: checkpoint {theirs[key]!r} vs model {ours[key]!r}" for key in ARCHITECTURE_KEYS
                   if key in ours and key in theirs and None not in (ours[key], theirs[key]) and ours[key] != theirs[key]]
    if differences:
        raise CheckpointError(f"checkpoint {checkpoint} holds another model than model.path {model_path} "
                              f"({'; '.join(differences)}); it cannot be loaded into this model: resume with the model it "
                              "was trained from, or set trainer.resume_mode=disable or a new trainer.default_local_dir")
