"""In-process unit tests of ``rlflow.engines.common.checkpoint``: atomic folders, the setup check, the
stepper state and RNG streams in the meta, and HF folders (the engines' checkpoints: the engine suite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from engine_testlib import toy_stepper
from rlflow.engines.common.checkpoint import checkpointing as ckpt
from rlflow.engines.common.checkpoint.hf_export import write_hf_folder
from rlflow.errors import CheckpointError
from rlflow.utils.seed import set_seed


# -------------------------------------------------------------------------------- checkpoints
def test_atomic_dir_replaces_only_on_success(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with ckpt.atomic_checkpoint_dir(target, None) as folder:
        (folder / "a.txt").write_text("first")
        ckpt.write_meta(folder, {"engine": "fsdp2"}, None)
    with pytest.raises(RuntimeError):
        with ckpt.atomic_checkpoint_dir(target, None) as folder:
            (folder / "a.txt").write_text("second")
            raise RuntimeError("killed")
    assert (target / "a.txt").read_text() == "first"
    assert ckpt.resolve_checkpoint_dir(target) == target
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.resolve_checkpoint_dir(tmp_path / "missing")
    (tmp_path / "half").mkdir()
    with pytest.raises(CheckpointError, match="incomplete"):
        ckpt.resolve_checkpoint_dir(tmp_path / "half")


def test_layout_check_names_every_difference(tmp_path: Path) -> None:
    saved = {"engine": "fsdp2", "model_kind": "causal_lm", "world_size": 4, "layout": {"dp_shard": 4}}
    current = {"engine": "fsdp2", "model_kind": "causal_lm", "world_size": 2, "layout": {"dp_shard": 2}}
    with pytest.raises(CheckpointError) as error:
        ckpt.check_compatible(saved, current, tmp_path)
    assert "world_size: checkpoint 4 vs this engine 2" in str(error.value) and "layout" in str(error.value)
    ckpt.check_compatible(saved, dict(saved), tmp_path)
    with pytest.raises(CheckpointError) as error:  # an engine that reshards: the layout is still checked
        ckpt.check_compatible(saved, current, tmp_path, reshard=True)
    assert "layout" in str(error.value) and "world_size" not in str(error.value)
    ckpt.check_compatible(saved, {**saved, "world_size": 2}, tmp_path, reshard=True)


def test_stepper_state_round_trips_through_the_checkpoint_meta(tmp_path: Path) -> None:
    _, stepper = toy_stepper()
    stepper.skipped_steps, stepper.schedule.step_count = 2, 3
    setup = ckpt.setup_meta("test_ddp", "causal_lm", 1, {"dp_replicate": 1})
    with ckpt.EngineCheckpointer(setup, stepper, 0, None).save(tmp_path / "c") as folder:
        (folder / "state.txt").write_text("model")
    _, fresh = toy_stepper()
    with ckpt.EngineCheckpointer(setup, fresh, 0, None).load(tmp_path / "c") as folder:
        assert (folder / "state.txt").read_text() == "model"
    assert (fresh.skipped_steps, fresh.schedule.step_count) == (2, 3)
    assert {"rng_rank0.pt", "engine_meta.json"} <= {p.name for p in (tmp_path / "c").iterdir()}
    other = ckpt.setup_meta("test_ddp", "causal_lm", 2, {"dp_replicate": 2})
    with pytest.raises(CheckpointError, match="world_size: checkpoint 1 vs this engine 2"):
        with ckpt.EngineCheckpointer(other, fresh, 0, None).load(tmp_path / "c"):
            pass


def test_rng_rule_when_the_world_size_changes(tmp_path: Path) -> None:
    """Rank r restores rng_rank{r}.pt when the checkpoint has it; a new rank reseeds from seed + r."""
    _, stepper = toy_stepper()
    setup = ckpt.setup_meta("fsdp2", "causal_lm", 1, {"dp_replicate": 1})
    set_seed(1234)
    with ckpt.EngineCheckpointer(setup, stepper, 0, None).save(tmp_path / "c"):
        pass
    saved_stream = torch.rand(3)  # what rank 0 draws after the save
    grown = {**setup, "world_size": 2}
    set_seed(7 + 1)
    expected_new_rank = torch.rand(3)
    for rank, expected in ((0, saved_stream), (1, expected_new_rank)):
        torch.manual_seed(99)  # whatever state the rank had before the load
        with ckpt.EngineCheckpointer(grown, stepper, rank, None, reshard=True, seed=7).load(tmp_path / "c"):
            pass
        assert torch.equal(torch.rand(3), expected), f"rank {rank}"
    with pytest.raises(CheckpointError, match="layout"):  # resharding frees the world size, nothing else
        with ckpt.EngineCheckpointer({**grown, "layout": {"dp_replicate": 2}}, stepper, 0, None, reshard=True).load(tmp_path / "c"):
            pass


# --------------------------------------------------------------------------------- HF folders
def test_sharded_hf_folder_loads_in_transformers(model_path: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_path)
    state = model.state_dict()
    out = write_hf_folder(tmp_path / "hf", state.items(), model_path, shard_bytes=50_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and set(index["weight_map"]) == set(state)
    assert (out / "tokenizer.json").is_file() and not list(out.glob(".*"))
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_a_model_config_replaces_the_source_config(model_path: Path, tmp_path: Path) -> None:
    config = AutoConfig.from_pretrained(model_path, num_labels=1)
    config.architectures = ["Qwen2ForTokenClassification"]
    out = write_hf_folder(tmp_path / "v", [("score.weight", torch.zeros(1, 4))], model_path, config)
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == ["Qwen2ForTokenClassification"] and len(written["id2label"]) == 1
    assert set(load_file(out / "model.safetensors")) == {"score.weight"}
    assert (out / "tokenizer.json").is_file()
