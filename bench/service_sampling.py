"""The Tinker service's sampling: requests batched into one rollout call against the same requests run one by one.

    python bench/service_sampling.py [--model HF_FOLDER --data VAL_PARQUET] [--prompts 256] [--samples 4]
                                     [--max-tokens 32] [--repeats 3] [--json PATH]

The SDK sends one ``asample`` request per prompt, and an RL loop sends a batch of them at once. Two
servers (``python -m rlflow.service``, fsdp2 and the vLLM sampler, one worker each) serve the same
model: one with ``service.max_sample_batch=1`` (each request alone, the service before batching) and
one with the default (queued requests of one sampler and one ``sampling_params`` in one rollout call).
A round sends ``--prompts`` requests of ``--samples`` samples at temperature 1 through the real
``tinker`` SDK without waiting, then reads every result; the time is from the first send to the last
result. The two servers take turns, ``--repeats`` rounds each after a warm-up round; the row is the
median. Without ``--model`` it builds the tiny preset and the demo task's val prompts (an untrained
model: every sample runs to ``--max-tokens``).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import tinker
from tinker import types
from transformers import AutoTokenizer

from rlflow.data.tasks import build_task, write_task_files
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset
from rlflow.workers.worker import find_free_port

from machine import machine_line
from results import BenchResult, Row, write_result

REPO = Path(__file__).resolve().parents[1]
API_KEY = "tml-bench"
START_TIMEOUT_S = 300


class Server:
    """A ``python -m rlflow.service`` serving ``model`` as base model ``bench``, stopped by ``stop``."""

    def __init__(self, model: Path, work_dir: Path, overrides: list[str]) -> None:
        self.url = f"http://127.0.0.1:{find_free_port()}"
        self.log = (work_dir / "service.log").open("w")
        args = [sys.executable, "-m", "rlflow.service", f"service.port={self.url.rsplit(':', 1)[1]}",
                f"service.api_keys=[{API_KEY}]", f"service.models.bench={model}",
                f"service.checkpoint_dir={work_dir / 'checkpoints'}", "engine=fsdp2", "rollout=vllm", *overrides]
        self.process = subprocess.Popen(args, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the service did not start; its log: {work_dir / 'service.log'}")
            time.sleep(0.5)

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/api/v1/healthz", headers={"X-API-Key": API_KEY}, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def task_prompts(model: Path, data: Path, limit: int) -> list[list[int]]:
    """The first ``limit`` prompts of a verl-format parquet, chat template applied, as token ids."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = pq.read_table(data).to_pylist()[:limit]
    return [list(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]) for row in rows]


def sampling_round(sampler: tinker.SamplingClient, prompts: list[list[int]], samples: int, max_tokens: int) -> tuple[float, int]:
    """Send every prompt at once, read every result: the seconds it took and the tokens sampled."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
    start = time.perf_counter()
    futures = [sampler.sample(types.ModelInput.from_ints(prompt), samples, params) for prompt in prompts]
    tokens = sum(len(sequence.tokens) for future in futures for sequence in future.result().sequences)
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: the tiny preset, built here)")
    parser.add_argument("--data", type=Path, default=None, help="verl-format parquet of prompts (default: the demo task's val split)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the result file (bench/results.py) here")
    args = parser.parse_args()
    print(machine_line())

    work = Path(tempfile.mkdtemp(prefix="rlflow-bench-service-"))
    model = args.model or build_preset(work / "tiny", tokenizer_corpus(), preset="tiny", seed=0)
    data = args.data or write_task_files(build_task("chain_arith", digits=1, num_ops=3), work / "data",
                                         n_train=1, n_val=args.prompts, seed=0)["val"]
    prompts = task_prompts(model, data, args.prompts)
    ways = {"one by one": ["service.max_sample_batch=1"], "batched": []}
    servers: dict[str, Server] = {}
    times: dict[str, list[float]] = {name: [] for name in ways}
    tokens: dict[str, list[int]] = {name: [] for name in ways}
    try:
        for name, overrides in ways.items():
            (work / name).mkdir()
            servers[name] = Server(model, work / name, overrides)
        clients = {name: tinker.ServiceClient(base_url=server.url, api_key=API_KEY) for name, server in servers.items()}
        samplers = {name: client.create_sampling_client(base_model="bench").result() for name, client in clients.items()}
        for name, sampler in samplers.items():
            sampling_round(sampler, prompts, args.samples, args.max_tokens)  # warm-up: worker start, first load
        for _ in range(args.repeats):
            for name, sampler in samplers.items():
                seconds, sampled = sampling_round(sampler, prompts, args.samples, args.max_tokens)
                times[name].append(seconds)
                tokens[name].append(sampled)
                print(f"{name:>10}: {seconds:6.2f} s, {sampled / seconds:7.0f} tokens/s")
        for client in clients.values():
            client.close("success").result(timeout=30)
    finally:
        for server in servers.values():
            server.stop()

    alone, batched = (statistics.median(times[name]) for name in ways)
    print(f"batched {batched:.2f} s against {alone:.2f} s one by one: {alone / batched:.2f}x")
    result = BenchResult(bench="service_sampling", title="Tinker service: sampling requests batched vs one by one",
                         notes=[f"{len(prompts)} asample requests x {args.samples} samples, max_tokens {args.max_tokens}, "
                                f"temperature 1, sent at once through the tinker SDK; fsdp2 + vLLM, 1 worker per server; "
                                f"medians of {args.repeats} rounds, the servers taking turns; model "
                                f"{args.model or 'the tiny preset, untrained (every sample runs to max_tokens)'}",
                                f"tokens/s: one by one {statistics.median(tokens['one by one']) / alone:.0f}, "
                                f"batched {statistics.median(tokens['batched']) / batched:.0f}"])
    result.rows.append(Row(name=f"{len(prompts)} requests x {args.samples} samples, batched", value=batched,
                           baseline_name="the same requests one by one (service.max_sample_batch=1)", baseline=alone,
                           unit="s", ratio=alone / batched, ratio_meaning="baseline / value (speed-up)"))
    write_result(args.json, result)


if __name__ == "__main__":
    main()
