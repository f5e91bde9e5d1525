"""Checkpoint and export: atomic DCP checkpoints with their meta and RNG, the offline reader of their model
state (``rlflow-export``), HF folders and peft adapter folders written from an export, merged LoRA weights."""
