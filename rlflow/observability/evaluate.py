"""Greedy accuracy of a model folder on RL-format prompts, scored by the reward registry.

``evaluate_greedy_accuracy(model_path, val_files)`` decodes every prompt greedily with one of
rlflow's rollout backends (``rlflow.rollout``: ``vllm``, the in-process vLLM engine, or ``hf``,
HF ``generate``) and scores the response with the reward function of the row's ``data_source``
(``rlflow.rewards``); a sample counts as correct when its score is at least ``correct_threshold``.
It is the "accuracy before/after" measure for SFT and RL on the synthetic tasks.

With ``tools`` (or rows that name an agent loop in ``agent_name``) each prompt runs its agent loop
(``rlflow.rollout.agent``; rows without ``agent_name`` run ``tool_agent``): the score reads the
model's tokens, as in training, and ``responses`` hold whole trajectories, tool turns included.

Both backends get the same prompts (``RLDataset``: the chat template and tokenisation of
training), the same greedy sampling and ``max_new_tokens``, and the same response cut (at EOS),
so they differ only in the decoder's arithmetic: a near-tie between two tokens may decode
differently. ``backend="auto"`` (the default) takes vLLM when it is installed, else HF.

Command line (``rlflow-eval`` is the same command)::

    python -m rlflow.observability.evaluate --model outputs/demo/sft/hf \\
        --data outputs/demo/data/val.parquet [--backend auto|vllm|hf] [--max-new-tokens 32] \\
        [--batch-size 64] [--limit N] [--responses FILE.jsonl] [--tools calculator ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from rlflow.config.multi_turn_schema import MultiTurnConfig
from rlflow.config.schema import RolloutConfig
from rlflow.data.rl_dataset import RLDataset
from rlflow.errors import UserError
from rlflow.models.loading import load_tokenizer
from rlflow.protocol import DataProto
from rlflow.rewards import RewardInput, get_reward_fn, score_one
from rlflow.rollout import build_rollout, rollout_names
from rlflow.rollout.agent import AGENT_NAME_COLUMN, generate_trajectories
from rlflow.utils.output_paths import check_output_file

AUTO_BACKEND = "auto"
BACKEND_PACKAGES = {"vllm": "vllm"}  # backend -> the package it imports; the others need only rlflow's own
GREEDY = {"n": 1, "do_sample": False, "temperature": 0.0, "seed": None}


def _installed(backend: str) -> bool:
    package = BACKEND_PACKAGES.get(backend)
    return package is None or importlib.util.find_spec(package) is not None


def resolve_backend(backend: str) -> str:
    """The rollout backend ``backend`` names; ``auto`` is ``vllm`` when the package is installed, else ``hf``."""
    if backend == AUTO_BACKEND:
        return "vllm" if _installed("vllm") else "hf"
    if backend not in rollout_names():
        raise UserError(f"--backend {backend!r}: choose one of {[AUTO_BACKEND, *rollout_names()]}")
    if not _installed(backend):
        raise UserError(f"--backend {backend}: the {BACKEND_PACKAGES[backend]!r} package is not installed; "
                        "install it, or choose --backend hf")
    return backend


def eval_rollout_config(backend: str, max_prompt_length: int, max_new_tokens: int, batch_size: int) -> RolloutConfig:
    """The rollout config of an evaluation: fp32, ``batch_size`` sequences decoded together, no sampling keys."""
    return RolloutConfig(name=backend, prompt_length=max_prompt_length, response_length=max_new_tokens, n=1,
                         do_sample=False, temperature=0.0, seed=None, max_num_seqs=batch_size, dtype="float32")


def decode_responses(output: DataProto, tokenizer: Any) -> list[str]:
    """The text of each rollout response's model tokens (through EOS, special tokens dropped)."""
    responses, mask = output.batch["responses"], output.batch["response_mask"].bool()
    return [tokenizer.decode(row[keep].tolist(), skip_special_tokens=True) for row, keep in zip(responses, mask)]


def decode_trajectories(output: DataProto, tokenizer: Any) -> list[str]:
    """The text of each whole response, tool and environment turns and the chat template's tokens included."""
    width = output.batch["prompts"].shape[1]
    attended = output.batch["attention_mask"][:, width:].bool()
    return [tokenizer.decode(row[keep].tolist()) for row, keep in zip(output.batch["responses"], attended)]


def generate_greedy(
    model_path: str | Path, prompts: DataProto, max_new_tokens: int, backend: str = AUTO_BACKEND,
    batch_size: int = 64, device: str = "auto", multi_turn: Optional[MultiTurnConfig] = None,
) -> tuple[list[str], list[str]]:
    """Greedy responses of the model folder to a left-padded prompt batch, one per row: the model's text (what
    a reward scores) and the text to show (with ``multi_turn``: the whole trajectory; else the same)."""
    name = resolve_backend(backend)
    max_prompt_length = prompts.batch["input_ids"].shape[1]
    config = eval_rollout_config(name, max_prompt_length, max_new_tokens, batch_size)
    with build_rollout(config, model_path, device) as rollout:
        if multi_turn is None:
            texts = decode_responses(rollout.generate(prompts, GREEDY), rollout.tokenizer)
            return texts, texts
        output, _ = generate_trajectories(rollout, prompts, multi_turn, GREEDY)
        return decode_responses(output, rollout.tokenizer), decode_trajectories(output, rollout.tokenizer)


def evaluate_greedy_accuracy(
    model_path: str | Path,
    val_files: str | Path | Iterable[str | Path],
    max_new_tokens: int = 32,
    batch_size: int = 64,
    limit: Optional[int] = None,
    max_prompt_length: int = 256,
    device: str = "auto",
    correct_threshold: float = 1.0,
    backend: str = AUTO_BACKEND,
    tools: Sequence[str] = (),
) -> dict[str, Any]:
    """Greedy-decode the prompts of ``val_files`` (verl RL format) with ``backend`` and score them.

    Returns ``accuracy`` (fraction with score >= ``correct_threshold``), ``mean_score``,
    ``num_samples``, ``accuracy/<data_source>`` per source, ``backend`` (the one that ran),
    ``responses`` (every response, in file order; whole trajectories with ``tools``) and ``examples``: the
    first few ``(prompt, response, ground_truth, score)`` for a look at what the model writes.
    """
    name = resolve_backend(backend)
    tokenizer = load_tokenizer(model_path)
    dataset = RLDataset(val_files, tokenizer, max_prompt_length=max_prompt_length, filter_overlong_prompts=False)
    count = len(dataset) if limit is None else min(limit, len(dataset))
    if count < 1:
        raise UserError(f"no prompts to evaluate in {val_files}")
    batch = dataset.collate(list(range(count)))
    multi_turn = None
    if tools or AGENT_NAME_COLUMN in batch.non_tensor_batch:
        multi_turn = MultiTurnConfig(enable=True, default_agent_loop="tool_agent", tools=list(tools))
    scored, responses = generate_greedy(model_path, batch, max_new_tokens, name, batch_size, device, multi_turn)
    scores: dict[str, list[float]] = defaultdict(list)
    examples: list[dict[str, Any]] = []
    for row, (text, response) in enumerate(zip(scored, responses)):
        data_source = batch.non_tensor_batch["data_source"][row]
        sample = RewardInput(data_source, text, batch.non_tensor_batch["ground_truth"][row],
                             batch.non_tensor_batch["extra_info"][row])
        score = score_one(get_reward_fn(data_source), sample, error_score=0.0).score
        scores[data_source].append(score)
        if len(examples) < 5:
            prompt = batch.non_tensor_batch["raw_prompt"][row][-1]["content"]
            examples.append({"prompt": prompt, "response": response, "ground_truth": sample.ground_truth, "score": score})
    every = [s for values in scores.values() for s in values]
    result: dict[str, Any] = {
        "accuracy": sum(s >= correct_threshold for s in every) / len(every),
        "mean_score": sum(every) / len(every),
        "num_samples": len(every),
        "backend": name,
        "responses": responses,
        "examples": examples,
    }
    for data_source, values in scores.items():
        result[f"accuracy/{data_source}"] = sum(s >= correct_threshold for s in values) / len(values)
    return result


def write_responses(path: str | Path, result: dict[str, Any]) -> None:
    """One JSON line per prompt, in file order: ``{"index", "response"}`` (the file's folder is created if missing)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        for index, response in enumerate(result["responses"]):
            out.write(json.dumps({"index": index, "response": response}) + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    """Command-line entry: print the greedy accuracy of ``--model`` on ``--data``."""
    parser = argparse.ArgumentParser(prog="python -m rlflow.observability.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF model folder (e.g. an SFT export)")
    parser.add_argument("--data", required=True, nargs="+", help="RL-format parquet/jsonl files with prompts and ground truth")
    parser.add_argument("--backend", default=AUTO_BACKEND, choices=[AUTO_BACKEND, *rollout_names()],
                        help="decoder: vllm, hf (HF generate), or auto (vllm when installed, else hf)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64, help="sequences decoded together")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N prompts")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--responses", default=None, metavar="FILE",
                        help="also write every response to this JSONL file")
    parser.add_argument("--tools", nargs="*", default=[], metavar="TOOL",
                        help="run the tool_agent loop with these tools (e.g. calculator); docs/agents.md")
    args = parser.parse_args(argv)
    try:
        if args.responses:  # checked before anything is generated, so no result is lost at the end
            check_output_file(args.responses, "--responses")
        result = evaluate_greedy_accuracy(args.model, args.data, args.max_new_tokens, args.batch_size, args.limit,
                                          device=args.device, backend=args.backend, tools=args.tools)
    except (UserError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.responses:
        write_responses(args.responses, result)
    for example in result["examples"][:3]:
        print(f"  {example['prompt']!r} -> {example['response']!r} (truth {example['ground_truth']}, score {example['score']})")
    print(f"accuracy {result['accuracy']:.4f} ({result['num_samples']} prompts, mean score {result['mean_score']:.4f}, "
          f"backend {result['backend']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
