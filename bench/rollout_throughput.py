"""Generation throughput of the vLLM and HF rollout backends on the same model and prompts.

For each preset size (tiny, 25m) and each backend: build the rollout, warm it up, then time
``generate`` on the same seeded prompts (``n`` samples each, sampled at temperature 1) and
count the generated tokens (response_mask). Prints tokens/s per backend and the vLLM/HF ratio.
One engine at a time. Weight-sync cost is measured by ``bench/weight_sync.py``.

Then rlflow's vLLM rollout against raw vLLM (target >= 0.95): one ``vllm.LLM``, built by the
rollout from its config (same model, dtype and engine settings for both), is timed through
``rollout.generate`` (tokenising, request seeds, cutting, padding into a DataProto) and through
``LLM.generate`` called directly with the same unpadded prompt ids and the same SamplingParams
(one request per sample, a seed each). Rounds alternate between the two (``--rounds``); the
ratio is of median generated tokens/s.

    python bench/rollout_throughput.py [--sizes tiny 25m] [--prompts 32] [--n 4] [--max-new-tokens 64] [--rounds 3]
                                       [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rlflow.config.schema import RolloutConfig, SamplingConfig
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset
from rlflow.protocol import DataProto
from rlflow.rollout import build_rollout
from rlflow.utils.device import limit_cpu_threads

from machine import machine_line
from results import BenchResult, Row, write_result

BACKENDS = ("hf", "vllm")
RAW_TARGET = 0.95


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


def raw_vllm_generate(llm: Any, prompts: DataProto, sampling: SamplingConfig, eos_ids: list[int]) -> int:
    """``LLM.generate`` on the prompts' unpadded ids, ``sampling.n`` seeded requests each; returns tokens generated."""
    from vllm import SamplingParams

    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    requests, params = [], []
    for row in range(len(prompts)):
        for sample in range(sampling.n):
            requests.append({"prompt_token_ids": ids[row][mask[row]].tolist()})
            params.append(SamplingParams(n=1, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                         top_p=sampling.top_p, top_k=sampling.top_k, stop_token_ids=eos_ids,
                                         seed=row * sampling.n + sample, logprobs=0, detokenize=False))
    outputs = llm.generate(requests, params, use_tqdm=False)
    return sum(len(output.outputs[0].token_ids) for output in outputs)


def rlflow_vs_raw(model_path: Path, prompts: DataProto, sampling: SamplingConfig, config: RolloutConfig,
                  rounds: int) -> dict[str, float]:
    """Median tokens/s of ``rollout.generate`` and of raw ``LLM.generate`` on the rollout's own engine, interleaved."""
    speeds: dict[str, list[float]] = {"rlflow": [], "raw": []}
    with build_rollout(replace(config, name="vllm"), model_path, "cpu") as rollout:
        contenders = {
            "rlflow": lambda: int(rollout.generate(prompts, sampling).batch["response_mask"].sum()),
            "raw": lambda: raw_vllm_generate(rollout._llm, prompts, sampling, sorted(rollout.eos_ids)),
        }
        for name, generate in contenders.items():  # warm-up both paths
            generate()
        for round_index in range(rounds):
            for name in sorted(contenders, reverse=round_index % 2 == 1):  # alternate which goes first
                start = time.perf_counter()
                tokens = contenders[name]()
                speeds[name].append(tokens / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in speeds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "25m"], help="preset sizes to run")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per generate call")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of rlflow vs raw vLLM")
    parser.add_argument("--json", default=None, help="write the result file (bench/results.py) here")
    parser.add_argument("--model-dir", default=None, help="where presets are built (default: a temp dir)")
    args = parser.parse_args()
    print(machine_line())
    limit_cpu_threads(1)
    model_root = Path(args.model_dir or tempfile.mkdtemp(prefix="rollout-bench-"))
    sampling = SamplingConfig(n=args.n, temperature=1.0, seed=0, max_new_tokens=args.max_new_tokens)
    config = RolloutConfig(prompt_length=48, response_length=args.max_new_tokens, kv_cache_space_gb=1.0)
    settings = (f"{args.prompts} prompts x {args.n} samples, up to {args.max_new_tokens} new tokens, temperature 1, "
                f"fp32, 1 thread; one generate call per timing")
    result = BenchResult(bench="rollout_throughput", title="Rollout generation throughput", notes=[settings])
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
        result.rows.append(Row(name=f"{size}: vLLM rollout", value=results["vllm"]["tokens_per_s"], baseline_name="HF rollout",
                               baseline=results["hf"]["tokens_per_s"], unit="tokens/s", ratio=ratio,
                               ratio_meaning="value / baseline (informational)"))
        speed = rlflow_vs_raw(model_path, prompts, sampling, config, args.rounds)
        raw_ratio = speed["rlflow"] / speed["raw"]
        print(f"{size:<6} rlflow vLLM rollout {speed['rlflow']:.0f} tok/s, raw vLLM {speed['raw']:.0f} tok/s: "
              f"ratio {raw_ratio:.3f} (target {RAW_TARGET})")
        result.rows.append(Row(name=f"{size}: rlflow vLLM rollout", value=speed["rlflow"], baseline_name="raw vllm.LLM.generate",
                               baseline=speed["raw"], unit="tokens/s", ratio=raw_ratio, ratio_meaning="value / baseline",
                               target=f">= {RAW_TARGET}", met=raw_ratio >= RAW_TARGET))
    result.notes.append(f"rlflow vs raw vLLM: medians of {args.rounds} interleaved rounds on one engine")
    write_result(args.json, result)


if __name__ == "__main__":
    main()
