"""Generation throughput of the vLLM and HF rollout backends on the same model and prompts.

For each preset size (tiny, 25m) and each backend: build the rollout, warm it up, then time
``generate`` on the same seeded prompts (``n`` samples each, sampled at temperature 1) and
count the generated tokens (response_mask). Prints tokens/s per backend and the vLLM/HF ratio.
One engine at a time. Weight-sync cost is measured by ``bench/weight_sync.py``.

    python bench/rollout_throughput.py [--sizes tiny 25m] [--prompts 32] [--n 4] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from rlflow.config.schema import RolloutConfig, SamplingConfig
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset
from rlflow.protocol import DataProto
from rlflow.rollout import build_rollout
from rlflow.utils.device import limit_cpu_threads

from machine import machine_line

BACKENDS = ("hf", "vllm")


def make_prompts(count: int, vocab: int, min_len: int = 16, max_len: int = 48) -> DataProto:
    """Seeded random-token prompts of varying length, left-padded."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=generator).tolist()
    ids = torch.zeros(count, max_len, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, max_len - length :] = torch.randint(3, vocab, (length,), generator=generator)
        mask[row, max_len - length :] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    uids = [str(i) for i in range(count)]
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": positions}, {"uid": uids})


def measure(
    backend: str, model_path: Path, prompts: DataProto, sampling: SamplingConfig, config: RolloutConfig
) -> dict:
    """Tokens/s of one timed generate (after a warm-up)."""
    start = time.perf_counter()
    with build_rollout(replace(config, name=backend), model_path, "cpu") as rollout:
        startup_s = time.perf_counter() - start
        rollout.generate(prompts[:4], replace(sampling, n=1, max_new_tokens=4))
        start = time.perf_counter()
        out = rollout.generate(prompts, sampling)
        generate_s = time.perf_counter() - start
    tokens = int(out.batch["response_mask"].sum())
    return {
        "startup_s": startup_s,
        "tokens": tokens,
        "generate_s": generate_s,
        "tokens_per_s": tokens / generate_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "25m"], help="preset sizes to run")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per generate call")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--model-dir", default=None, help="where presets are built (default: a temp dir)")
    args = parser.parse_args()
    print(machine_line())
    limit_cpu_threads(1)
    model_root = Path(args.model_dir or tempfile.mkdtemp(prefix="rollout-bench-"))
    sampling = SamplingConfig(n=args.n, temperature=1.0, seed=0, max_new_tokens=args.max_new_tokens)
    config = RolloutConfig(prompt_length=48, response_length=args.max_new_tokens, kv_cache_space_gb=1.0)
    print(f"{'model':<6} {'backend':<7} {'seqs':>5} {'tokens':>7} {'start s':>8} {'gen s':>7} {'tok/s':>8}")
    for size in args.sizes:
        model_path = build_preset(model_root / size, tokenizer_corpus(), preset=size, seed=0)
        prompts = make_prompts(args.prompts, vocab=300)
        results = {}
        for backend in BACKENDS:
            r = results[backend] = measure(backend, model_path, prompts, sampling, config)
            print(
                f"{size:<6} {backend:<7} {args.prompts * args.n:>5} {r['tokens']:>7} {r['startup_s']:>8.1f} "
                f"{r['generate_s']:>7.2f} {r['tokens_per_s']:>8.0f}"
            )
        ratio = results["vllm"]["tokens_per_s"] / results["hf"]["tokens_per_s"]
        print(f"{size:<6} vllm/hf generation throughput ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
