"""A local Hugging Face cache under which tinker-cookbook's ``sl_loop`` and ``rl_loop`` run offline, unmodified.

The two loops name things on the hub: a model from the cookbook's registry (its tokenizer comes from the hub
and its renderer from the registry) and the datasets ``HuggingFaceH4/no_robots`` and ``openai/gsm8k``. On a
machine without the hub this script writes, under one ``HF_HOME`` folder, what ``HF_HUB_OFFLINE=1`` makes
them read instead:

* ``--model-name`` (a registry name, e.g. ``Qwen/Qwen3-8B-Base``, whose renderer is ``role_colon``): the
  tokenizer and config files of ``--tokenizer-from``, as a hub snapshot. The service serves that name from a
  local folder (``service.models={Qwen/Qwen3-8B-Base:/path}``); the name is only a key.
* ``openai/gsm8k`` (config ``main``) and ``HuggingFaceH4/no_robots``: stand-ins made from an rlflow task
  folder (``python -m rlflow.data.tasks``), in the columns the loops read. gsm8k rows are the task's question
  and worked solution ending ``#### <n>``; no_robots rows are two-exchange chats whose answers are the worked
  solutions with the result in ``\\boxed{}``, the question followed by rl_loop's instruction.
* ``--sft-out``: the same chats as a parquet file for rlflow's SFT, and ``--role-colon-model``: a copy of the
  model folder whose chat template is the role_colon layout (``User: ...``, ``Assistant: ...``), so a warm
  start trained by rlflow sees the token layout the cookbook's renderer builds.

The dataset caches are written in the format of the ``datasets`` this script runs with: run it with the
cookbook venv's Python (``scripts/cookbook_venv.sh``). It writes only inside folders it creates or that hold
its marker file. docs/service.md, "tinker-cookbook", shows the whole run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datasets.packaged_modules.parquet.parquet import Parquet

MARKER = ".rlflow-cookbook-hub"
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json",
               "special_tokens_map.json")
# What rl_loop appends to every question; the stand-in chats end their questions the same way.
BOXED_INSTRUCTION = " Provide a numerical answer without units, written inside \\boxed{}."
ROLE_COLON_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def refuse(message: str) -> None:
    """One line on stderr, exit 2 (bad input), before anything is written."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse what the writers below would trip on: the model folder, the task files, folders not ours."""
    if not (args.tokenizer_from / "tokenizer.json").is_file():
        refuse(f"--tokenizer-from {args.tokenizer_from} holds no tokenizer.json; give the served model's HF folder")
    for split in ("train", "val"):
        if not (args.task / f"{split}.parquet").is_file():
            refuse(f"--task {args.task} holds no {split}.parquet; write one with python -m rlflow.data.tasks")
    for path in (args.home, args.sft_out, args.role_colon_model):
        if path.exists() and (not path.is_dir() or any(path.iterdir()) and not (path / MARKER).exists()):
            refuse(f"{path} exists and was not written by this script; name a new folder")


def owned_folder(path: Path) -> Path:
    """``path``, created with the marker file (``check_inputs`` refused a folder that is not ours)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).touch()
    return path


def write_model_snapshot(home: Path, name: str, folder: Path) -> Path:
    """The tokenizer and config files of ``folder`` as the hub snapshot of model ``name`` (``refs/main`` set)."""
    files = [file for file in MODEL_FILES if (folder / file).exists()]
    revision = hashlib.sha1(b"".join((folder / file).read_bytes() for file in files)).hexdigest()
    repo = home / "hub" / ("models--" + name.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in files:
        shutil.copy(folder / file, snapshot / file)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def write_dataset(home: Path, repo_id: str, config: str, splits: dict[str, list[dict]]) -> Path:
    """``splits`` as the prepared ``datasets`` cache of ``repo_id``/``config``, where an offline load finds it."""
    namespace, name = repo_id.split("/")
    target = home / "datasets" / f"{namespace}___{name}" / config / "0.0.0"
    with tempfile.TemporaryDirectory() as scratch:
        files = {}
        for split, rows in splits.items():
            files[split] = str(Path(scratch) / f"{split}.parquet")
            pq.write_table(pa.Table.from_pylist(rows), files[split])
        builder = Parquet(cache_dir=str(Path(scratch) / "cache"), dataset_name=name, config_name=config,
                          hash="0" * 16, data_files=files)
        builder.download_and_prepare()
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(builder.cache_dir, target / ("0" * 16))
    return target


def task_questions(task_folder: Path, split: str) -> list[tuple[str, str]]:
    """(question, worked solution ending ``#### <n>``) of each row of an rlflow task file."""
    rows = pq.read_table(task_folder / f"{split}.parquet").to_pylist()
    return [(row["prompt"][0]["content"].split("?")[0] + "?", row["extra_info"]["solution"]) for row in rows]


def boxed(solution: str) -> str:
    """A worked solution with its ``#### <n>`` line turned into ``\\boxed{<n>}``."""
    work, _, result = solution.rpartition("#### ")
    return f"{work}\\boxed{{{result.strip()}}}"


def two_exchange_chats(pairs: list[tuple[str, str]], seed: int) -> list[dict]:
    """no_robots-shaped rows: each question after another one already answered, both answers boxed."""
    rng = random.Random(seed)
    rows = []
    for index, (question, solution) in enumerate(pairs):
        shot_question, shot_solution = pairs[rng.randrange(len(pairs))]
        messages = [{"role": "user", "content": shot_question + BOXED_INSTRUCTION},
                    {"role": "assistant", "content": boxed(shot_solution)},
                    {"role": "user", "content": question + BOXED_INSTRUCTION},
                    {"role": "assistant", "content": boxed(solution)}]
        rows.append({"prompt": question, "prompt_id": str(index), "messages": messages, "category": "Math"})
    return rows


def role_colon_model(folder: Path, out: Path) -> None:
    """A copy of the model ``folder`` whose tokenizer's chat template is the role_colon layout."""
    shutil.copytree(folder, out, dirs_exist_ok=True)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = ROLE_COLON_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
    (out / "chat_template.jinja").unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="the HF_HOME folder to write (new, or this script's)")
    parser.add_argument("--model-name", default="Qwen/Qwen3-8B-Base", help="the registry name the loops are given")
    parser.add_argument("--tokenizer-from", type=Path, required=True, help="the served model's HF folder")
    parser.add_argument("--task", type=Path, required=True, help="an rlflow task folder (train.parquet, val.parquet)")
    parser.add_argument("--sft-out", type=Path, required=True, help="folder for the warm start's SFT parquet files")
    parser.add_argument("--role-colon-model", type=Path, required=True, help="folder for the role_colon model copy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    check_inputs(args)

    home = owned_folder(args.home)
    print("model:", write_model_snapshot(home, args.model_name, args.tokenizer_from))
    train, test = task_questions(args.task, "train"), task_questions(args.task, "val")
    gsm8k = {split: [{"question": q, "answer": a} for q, a in pairs] for split, pairs in (("train", train), ("test", test))}
    print("openai/gsm8k:", write_dataset(home, "openai/gsm8k", "main", gsm8k))
    chats = {"train": two_exchange_chats(train, args.seed), "test": two_exchange_chats(test, args.seed + 1)}
    print("HuggingFaceH4/no_robots:", write_dataset(home, "HuggingFaceH4/no_robots", "default", chats))
    sft = owned_folder(args.sft_out)
    for split, name in (("train", "sft_train"), ("test", "sft_val")):
        pq.write_table(pa.Table.from_pylist([{"messages": row["messages"]} for row in chats[split]]), sft / f"{name}.parquet")
    print("SFT rows:", sft)
    role_colon_model(args.tokenizer_from, owned_folder(args.role_colon_model))
    print("role_colon model:", args.role_colon_model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
