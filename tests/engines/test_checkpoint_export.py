"""``rlflow-export``: engine checkpoints written by 2 ranks become HF folders that transformers loads.

Acceptance: the exported model's per-token log-probs and entropies (from its full logits) are
those the live engine computed right after saving the checkpoint (``checkpoint_scenarios``:
``probe``), within ``TOKEN_TOL``, and its weights equal the live engine's export bit for bit.
Every registered engine's checkpoint is exported; each carries its model files (``hf_config/``).
A checkpoint without them needs ``--model-path`` (``test_tied_embeddings_are_written_once``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from checkpoint_scenarios import probe_batch
from engine_testlib import ENGINES, TEST_MODEL_OPTIONS, load_results, reference_token_stats
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.engines.common.checkpoint.hf_export import EXPORT_MARKER
from rlflow.models.presets import build_preset
from rlflow.trainer.export_checkpoint import main

TOKEN_TOL = 1e-5  # fp32: the HF model's padded full-logits forward vs the engine's packed, chunked one
pytestmark = pytest.mark.timeout(900)  # may be the first test to need the 2-rank launch (conftest.py)


@pytest.mark.parametrize("engine", ENGINES)
def test_export_of_a_two_rank_checkpoint_has_the_live_engines_outputs(
    engine: str, two_rank: Path, tmp_path: Path
) -> None:
    live = load_results(two_rank, "checkpoint.pt")[engine]
    checkpoint = two_rank / f"ckpt_{engine}"
    assert (checkpoint / "hf_config").is_dir(), "an engine checkpoint keeps the model's config and tokenizer"
    assert main([str(checkpoint), str(tmp_path / "hf")]) == 0
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    state = model.state_dict()
    assert set(live["weights"]) <= set(state)
    assert all(torch.equal(state[name], tensor) for name, tensor in live["weights"].items())
    with torch.no_grad():
        log_probs, entropy = reference_token_stats(model, probe_batch())
    torch.testing.assert_close(log_probs, live["probe"]["log_probs"], atol=TOKEN_TOL, rtol=0)
    torch.testing.assert_close(entropy, live["probe"]["entropy"], atol=TOKEN_TOL, rtol=0)
    assert log_probs.abs().sum() > 0
    assert len(AutoTokenizer.from_pretrained(tmp_path / "hf")) > 100
    assert (tmp_path / "hf" / EXPORT_MARKER).is_file()


def _fake_step(root: Path, checkpoint: Path, roles: list[str]) -> Path:
    """A global_step_N folder holding ``checkpoint`` under each role name, as the drivers lay it out."""
    step = root / "global_step_3"
    for role in roles:
        shutil.copytree(checkpoint, step / role)
    torch.save({"step": 3}, step / "driver_state.pt")
    (root / "latest_checkpointed_iteration.txt").write_text("3")
    return step


def test_step_and_run_folders_pick_the_role(two_rank: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    step = _fake_step(tmp_path / "ppo", two_rank / "ckpt_fsdp2", ["actor", "critic"])
    assert main([str(step), str(tmp_path / "a")]) == 0 and "global_step_3/actor" in capsys.readouterr().out
    assert main([str(step), str(tmp_path / "c"), "--role", "critic"]) == 0 and "critic" in capsys.readouterr().out
    assert main([str(tmp_path / "ppo"), str(tmp_path / "a")]) == 0, "a run folder: its newest step; an earlier export is replaced"
    sft_step = _fake_step(tmp_path / "sft", two_rank / "ckpt_fsdp", ["engine"])
    assert main([str(sft_step), str(tmp_path / "s")]) == 0 and "global_step_3/engine" in capsys.readouterr().out
    assert main([str(sft_step), str(tmp_path / "x"), "--role", "actor"]) == 2
    assert "--role actor is needed; its engine checkpoints are ['engine']" in capsys.readouterr().err


def _one_line_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_bad_input_is_one_line_and_exit_2(two_rank: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert "does not exist" in _one_line_error(capsys)
    user_folder = tmp_path / "mine"
    user_folder.mkdir()
    (user_folder / "notes.txt").write_text("keep")
    assert main([str(two_rank / "ckpt_fsdp2"), str(user_folder)]) == 2
    assert "rlflow did not export" in _one_line_error(capsys)
    assert [p.name for p in user_folder.iterdir()] == ["notes.txt"], "a user's folder is never written over"
    damaged = tmp_path / "damaged"
    shutil.copytree(two_rank / "ckpt_fsdp2", damaged)
    shard = next((damaged / "model_optim").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:64])  # cut short inside the model weights (written before the optimizer state)
    assert main([str(damaged), str(tmp_path / "out")]) == 2
    assert "cannot be read" in _one_line_error(capsys)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
    (damaged / "model_optim" / ".metadata").unlink()
    assert main([str(damaged), str(tmp_path / "out")]) == 2
    assert ".metadata is missing" in _one_line_error(capsys)
    without_model_files = tmp_path / "without_model_files"
    shutil.copytree(two_rank / "ckpt_fsdp2", without_model_files)
    shutil.rmtree(without_model_files / "hf_config")
    assert main([str(without_model_files), str(tmp_path / "out")]) == 2
    assert "--model-path" in _one_line_error(capsys)


def test_out_is_checked_before_the_checkpoint_is_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "a_file").write_text("mine")
    assert main([str(tmp_path / "no_checkpoint"), str(tmp_path / "a_file")]) == 2
    assert f"OUT {tmp_path / 'a_file'} is a file; name a folder" in _one_line_error(capsys)
    assert main([str(tmp_path / "no_checkpoint"), str(tmp_path / "a_file" / "hf")]) == 2
    assert "is a file, so the path cannot be created" in _one_line_error(capsys)
    assert (tmp_path / "a_file").read_text() == "mine"


def test_a_corrupt_engine_meta_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "engine_meta.json").write_text('{"engine": "fsdp2", "model_ki')  # cut off mid-write
    assert main([str(checkpoint), str(tmp_path / "out")]) == 2
    line = _one_line_error(capsys)
    assert f"checkpoint file {checkpoint / 'engine_meta.json'}: not valid JSON at line 1, column 21 (character 20)" in line
    assert line.rstrip().endswith("(the text ends early: cut off?)"), line
    assert not (tmp_path / "out").exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the one-process save is the point
def test_tied_embeddings_are_written_once(tmp_path: Path) -> None:
    """A model with tied embeddings: its state dict names the tensor twice, the export (like save_pretrained) once.

    The checkpoint is written the way ``save_module_state`` lays it out (DCP, ``{"model": {"model.<hf name>": ...}}``),
    from one process: the reader does not care how many ranks wrote it (the 2-rank tests above).
    """
    model_dir = build_preset(tmp_path / "tied", tokenizer_corpus(), preset="tiny-qwen2", seed=0, **TEST_MODEL_OPTIONS)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    checkpoint = tmp_path / "ckpt"
    state = {"model": {f"model.{name}": tensor for name, tensor in model.state_dict().items()}}
    assert "model.lm_head.weight" in state["model"]
    dcp.save(state, checkpoint_id=str(checkpoint / "model_optim"), no_dist=True)
    (checkpoint / "engine_meta.json").write_text(json.dumps({"engine": "fsdp2", "model_kind": "causal_lm", "world_size": 1}))
    assert main([str(checkpoint), str(tmp_path / "hf"), "--model-path", str(model_dir)]) == 0
    written = set(load_file(tmp_path / "hf" / "model.safetensors"))
    assert written == {name for name, _ in model.named_parameters()} and "lm_head.weight" not in written
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    ids = torch.arange(1, 20)[None]
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
