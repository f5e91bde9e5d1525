"""Seven of verl's own example scripts, through rlflow-from-verl, to a validated rlflow command and a 1-step run.

``verl_scripts/*.txt`` hold each script's override list exactly as bash hands it to verl (verl's keys
and values, quoted as in the script), with ``@NAME@`` where the script names a dataset or model; the
test writes a copy with local files in those places. The translation must pass the entry point's
whole pre-Ray validation (``EntryPoint.validate``: what ``--validate`` runs) as it stands, on the
tiny presets (tiny-qwen2 for the Megatron script, whose pipeline of 2 stages needs an even layer
count) with local data sized for the scripts' batches. Then each run starts and finishes one step,
with the cluster and the lengths shrunk to fit a CPU test (``SHRINK``); every other translated key
is kept. The SFT run is in ``make test``; the six PPO runs (vLLM rollouts, minutes each) in ``full``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REPO, read_jsonl
from rlflow.config.loading.verl_translate import Translation, translate
from rlflow.config.verl_script import read_verl_command
from rlflow.data.tasks import build_task, write_task_files
from rlflow.trainer.from_verl import check
from test_hf_value_models import save_sequence_classifier

SCRIPTS = Path(__file__).resolve().parent / "verl_scripts"
PPO_SCRIPTS = ("grpo_lora", "ppo_seq_balance", "grpo_megatron", "grpo_deepseek", "ppo_rm", "ppo_rm_seq_balance")
RUN_LIMITS = ["trainer.total_training_steps=1", "trainer.nnodes=1", "trainer.ray_num_cpus=2", "trainer.logger=[console,jsonl]",
              "trainer.save_freq=-1", "trainer.test_freq=-1"]
# One step is shorter than the warmup the translation derived for the scripts' whole runs: no warmup in the 1-step runs.
SHRINK = {
    "ppo_trainer": RUN_LIMITS + ["trainer.n_procs_per_node=1", "data.train_batch_size=4", "data.max_prompt_length=64",
                                 "data.max_response_length=12", "actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2",
                                 "rollout.n=2", "trainer.val_before_train=false", "actor.engine.lr_scheduler.warmup_steps=0",
                                 "critic.engine.lr_scheduler.warmup_steps=0"],
    "sft_trainer": RUN_LIMITS + ["trainer.n_procs_per_node=1", "data.train_batch_size=8", "data.max_length=128",
                                 "engine.lr_scheduler.warmup_steps=0"],
}
# The Megatron script's layout (TP 2 x PP 2 on 8 GPUs) at two CPU processes: tensor parallel 2, one pipeline stage.
SHRINK_LAYOUT = {"grpo_megatron": ["trainer.n_procs_per_node=2", "actor.engine.pipeline_model_parallel_size=1",
                                   "ref.engine.pipeline_model_parallel_size=1"]}


@pytest.fixture(scope="module")
def local_files(tmp_path_factory, tiny_model) -> dict[str, Path]:
    """What the scripts' @NAME@ stand for: RL files of 4096 prompts (the largest train_batch_size), GSM8K-shaped SFT
    files (question and answer inside extra_info, as verl's gsm8k preprocessing writes them), the models."""
    root = tmp_path_factory.mktemp("verl_scripts")
    write_task_files(build_task("addition", digits=2), root, n_train=4096, n_val=16, seed=0)
    for split in ("train", "val"):
        rows = pq.read_table(root / f"sft_{split}.parquet").to_pylist()
        nested = [{"extra_info": {"question": row["messages"][0]["content"], "answer": row["messages"][1]["content"]}} for row in rows]
        pq.write_table(pa.Table.from_pylist(nested), root / f"gsm8k_sft_{split}.parquet")
    reward_model = save_sequence_classifier(tiny_model, root / "models" / "reward_model")
    return {"@GSM8K_TRAIN@": root / "train.parquet", "@GSM8K_TEST@": root / "val.parquet", "@MATH_TRAIN@": root / "train.parquet",
            "@MATH_TEST@": root / "val.parquet", "@MODEL@": tiny_model, "@REWARD_MODEL@": reward_model,
            "@MEGATRON_MODEL@": reward_model.parent / "tiny-qwen2", "@SFT_TRAIN@": root / "gsm8k_sft_train.parquet",
            "@SFT_TEST@": root / "gsm8k_sft_val.parquet"}


def local_copy(name: str, files: dict[str, Path], folder: Path) -> Path:
    """The script's override list with local paths in place of @NAME@ (SFT data and the Megatron model where they differ)."""
    text = (SCRIPTS / f"{name}.txt").read_text()
    own = {"@GSM8K_TRAIN@": files["@SFT_TRAIN@"], "@GSM8K_TEST@": files["@SFT_TEST@"]} if name == "sft_peft" else {}
    own |= {"@MODEL@": files["@MEGATRON_MODEL@"]} if name == "grpo_megatron" else {}
    for placeholder, path in {**files, **own, "@SAVE@": folder / "run"}.items():
        text = text.replace(placeholder, str(path))
    copy = folder / f"{name}.txt"
    copy.write_text(text)
    return copy


def translated(name: str, files: dict[str, Path], folder: Path) -> Translation:
    return translate(read_verl_command(local_copy(name, files, folder).read_text(), {}), "cpu")


@pytest.mark.parametrize("name", [*PPO_SCRIPTS, "sft_peft"])
def test_a_translated_verl_script_passes_the_whole_pre_ray_validation(name, local_files, tmp_path):
    translation = translated(name, local_files, tmp_path)
    assert translation.entry == ("sft_trainer" if name == "sft_peft" else "ppo_trainer")
    check(translation, with_files=True)  # EntryPoint.compose + preflight: --validate's checks, model and data included
    assert not (tmp_path / "run").exists()


def test_the_command_translates_a_script_and_validates_it(local_files, tmp_path):
    """``python -m rlflow.trainer.from_verl FILE --validate``: the script on stdout, one check, exit 0."""
    copy = local_copy("ppo_rm", local_files, tmp_path)
    result = subprocess.run([sys.executable, "-m", "rlflow.trainer.from_verl", str(copy), "--device", "cpu", "--validate"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("# rlflow-ppo, translated by rlflow-from-verl")
    assert "#   reward_model.use_reward_loop=True: rlflow scores with the reward model's own forward pass" in result.stdout
    # verl warms the actor up over int(0.1 x 120) = 12 of its once-per-step schedule's steps (8192 rows // 1024 x 15 epochs);
    # rlflow steps per update, 1024 / 256 = 4 a step: 48
    assert "    actor.engine.lr_scheduler.warmup_steps=48 \\" in result.stdout
    assert "the translation validates (every pre-Ray check)" in result.stderr


def run_translated(name: str, files: dict[str, Path], folder: Path) -> Path:
    """Run the translated command for one step (``SHRINK``); returns the run folder."""
    translation = translated(name, files, folder)
    run_dir = folder / "run"
    module = {"ppo_trainer": "rlflow.trainer.main_ppo", "sft_trainer": "rlflow.trainer.main_sft"}[translation.entry]
    overrides = translation.overrides + SHRINK[translation.entry] + SHRINK_LAYOUT.get(name, []) + [f"trainer.default_local_dir={run_dir}"]
    result = subprocess.run([sys.executable, "-m", module, *overrides], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{shlex.join(overrides)}\n{result.stderr[-4000:]}"
    assert {record["step"] for record in read_jsonl(run_dir / "metrics.jsonl")} - {0} == {1}
    return run_dir


@pytest.mark.full  # with the six PPO scripts' runs; make test validates all seven translations
def test_the_translated_peft_sft_script_runs_a_step(local_files, tmp_path):
    run_dir = run_translated("sft_peft", local_files, tmp_path)
    assert (run_dir / "hf" / "config.json").is_file()


@pytest.mark.full
@pytest.mark.parametrize("name", PPO_SCRIPTS)
def test_a_translated_ppo_script_runs_a_step(name, local_files, tmp_path):
    assert (run_translated(name, local_files, tmp_path) / "hf" / "config.json").is_file()
