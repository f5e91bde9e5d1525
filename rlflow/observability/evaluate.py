"""Greedy accuracy of a model folder on RL-format prompts, scored by the reward registry.

``evaluate_greedy_accuracy(model_path, val_files)`` decodes every prompt greedily with HF
``generate`` and scores the response with the reward function of the row's ``data_source``
(``rlflow.rewards``); a sample counts as correct when its score is at least ``correct_threshold``.
It is the "accuracy before/after" measure for SFT and RL on the synthetic tasks.

Command line::

    python -m rlflow.observability.evaluate --model outputs/checkpoints/rlflow/sft_tiny/hf \\
        --data outputs/data/addition/val.parquet [--max-new-tokens 32] [--batch-size 64] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional

import torch

from rlflow.data.rl_dataset import RLDataset
from rlflow.errors import UserError
from rlflow.models.loading import load_causal_lm, load_tokenizer
from rlflow.protocol import DataProto
from rlflow.rewards import RewardInput, get_reward_fn, score_one
from rlflow.utils.device import get_torch_device


def _trim_left_padding(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` without the columns that are padding in every row."""
    mask = batch.batch["attention_mask"]
    first = int(mask.any(dim=0).nonzero()[0])
    return batch.batch["input_ids"][:, first:], mask[:, first:]


@torch.no_grad()
def generate_greedy(model: Any, tokenizer: Any, batch: DataProto, max_new_tokens: int) -> list[str]:
    """Greedy responses (decoded, special tokens dropped) for a left-padded prompt batch."""
    input_ids, attention_mask = _trim_left_padding(batch)
    device = next(model.parameters()).device
    output = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    responses = output[:, input_ids.shape[1] :]
    return tokenizer.batch_decode(responses, skip_special_tokens=True)


def evaluate_greedy_accuracy(
    model_path: str | Path,
    val_files: str | Path | Iterable[str | Path],
    max_new_tokens: int = 32,
    batch_size: int = 64,
    limit: Optional[int] = None,
    max_prompt_length: int = 256,
    device: str = "auto",
    correct_threshold: float = 1.0,
) -> dict[str, Any]:
    """Greedy-decode the prompts of ``val_files`` (verl RL format) and score them.

    Returns ``accuracy`` (fraction with score >= ``correct_threshold``), ``mean_score``,
    ``num_samples``, ``accuracy/<data_source>`` per source, and ``examples``: the first few
    ``(prompt, response, ground_truth, score)`` for a look at what the model writes.
    """
    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "left"
    dataset = RLDataset(val_files, tokenizer, max_prompt_length=max_prompt_length, filter_overlong_prompts=False)
    count = len(dataset) if limit is None else min(limit, len(dataset))
    if count < 1:
        raise UserError(f"no prompts to evaluate in {val_files}")
    model = load_causal_lm(model_path, dtype="float32").to(get_torch_device(device)).eval()
    scores: dict[str, list[float]] = defaultdict(list)
    examples: list[dict[str, Any]] = []
    for start in range(0, count, batch_size):
        batch = dataset.collate(list(range(start, min(start + batch_size, count))))
        responses = generate_greedy(model, tokenizer, batch, max_new_tokens)
        for row, response in enumerate(responses):
            data_source = batch.non_tensor_batch["data_source"][row]
            sample = RewardInput(data_source, response, batch.non_tensor_batch["ground_truth"][row],
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
        "examples": examples,
    }
    for data_source, values in scores.items():
        result[f"accuracy/{data_source}"] = sum(s >= correct_threshold for s in values) / len(values)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    """Command-line entry: print the greedy accuracy of ``--model`` on ``--data``."""
    parser = argparse.ArgumentParser(prog="python -m rlflow.observability.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF model folder (e.g. an SFT export)")
    parser.add_argument("--data", required=True, nargs="+", help="RL-format parquet/jsonl files with prompts and ground truth")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N prompts")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    args = parser.parse_args(argv)
    try:
        result = evaluate_greedy_accuracy(args.model, args.data, args.max_new_tokens, args.batch_size, args.limit,
                                          device=args.device)
    except (UserError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for example in result["examples"][:3]:
        print(f"  {example['prompt']!r} -> {example['response']!r} (truth {example['ground_truth']}, score {example['score']})")
    print(f"accuracy {result['accuracy']:.4f} ({result['num_samples']} prompts, mean score {result['mean_score']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
