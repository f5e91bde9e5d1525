"""What the service tests do with the real ``tinker`` SDK: a supervised loop, an RL loop on the demo task,
greedy samples, and a load of concurrent clients. Each function talks to a live server only through the SDK,
except ``peft_adamw_run``, the plain peft + AdamW reference the training tests compare with."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import httpx
import pyarrow.parquet as pq
import tinker
import torch
from peft import PeftModel
from tinker import types
from transformers import AutoModelForCausalLM

from rlflow.rewards.registry import get_reward_fn

ARITHMETIC = ["12+7=19", "3+4=7", "25+30=55", "8+8=16", "40+2=42", "61+17=78"]


def sft_data(tokenizer, texts: list[str] = ARITHMETIC) -> list[types.Datum]:
    """Cross-entropy data: each text predicts its own next tokens."""
    data = []
    for text in texts:
        ids = tokenizer.encode(text)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)}))
    return data


def supervised_loop(client: tinker.TrainingClient, data: list[types.Datum], steps: int, lr: float) -> list[float]:
    """``steps`` of cross-entropy + AdamW, each submitted without waiting; the ``loss:sum`` of each step."""
    futures = [(client.forward_backward(data, "cross_entropy"), client.optim_step(types.AdamParams(learning_rate=lr)))
               for _ in range(steps)]
    losses = []
    for forward_backward, optim_step in futures:
        losses.append(forward_backward.result().metrics["loss:sum"])
        optim_step.result()
    return losses


def greedy(sampler: tinker.SamplingClient, prompts: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
    """The greedy completion of each prompt."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts]
    return [future.result().sequences[0].tokens for future in futures]


@dataclass
class TaskRows:
    """Demo-task problems: chat prompts as token ids, and what scores an answer."""

    prompts: list[list[int]]
    ground_truths: list[str]
    data_source: str

    @classmethod
    def load(cls, parquet: Path, tokenizer, limit: int) -> "TaskRows":
        rows = pq.read_table(parquet).to_pylist()[:limit]
        prompts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True) for row in rows]
        prompts = [list(p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p) for p in prompts]
        return cls(prompts, [row["reward_model"]["ground_truth"] for row in rows], rows[0]["data_source"])

    def reward(self, tokenizer, index: int, tokens: list[int]) -> float:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        return float(get_reward_fn(self.data_source)(self.data_source, text, self.ground_truths[index]))

    def mean_reward(self, tokenizer, sampler: tinker.SamplingClient, samples: int, max_tokens: int) -> float:
        """The mean reward of ``samples`` completions per prompt at temperature 1: what the RL loop raises."""
        params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
        futures = [sampler.sample(types.ModelInput.from_ints(p), samples, params) for p in self.prompts]
        return statistics.mean(self.reward(tokenizer, i, sequence.tokens)
                               for i, future in enumerate(futures) for sequence in future.result().sequences)


def rl_step(client: tinker.TrainingClient, sampler: tinker.SamplingClient, tokenizer, rows: TaskRows, indices: list[int],
            group: int, max_tokens: int, lr: float) -> float:
    """One GRPO-style step through the SDK: sample a group per prompt, score, group-relative advantages scaled
    to a token mean, ``importance_sampling`` forward_backward, one AdamW step. Returns the mean reward."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
    futures = [sampler.sample(types.ModelInput.from_ints(rows.prompts[i]), group, params) for i in indices]
    samples, rewards = [], []
    for index, future in zip(indices, futures):
        sequences = future.result().sequences
        scores = [rows.reward(tokenizer, index, s.tokens) for s in sequences]
        mean = statistics.mean(scores)
        samples += [(index, s, score - mean) for s, score in zip(sequences, scores)]
        rewards += scores
    response_tokens = sum(len(s.tokens) for _, s, _ in samples)
    data = []
    for index, sequence, advantage in samples:
        prompt, response = rows.prompts[index], list(sequence.tokens)
        tokens = prompt + response
        pad = [0.0] * (len(prompt) - 1)
        data.append(types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": pad + list(sequence.logprobs),
                            "advantages": pad + [advantage / response_tokens] * len(response)}))
    client.forward_backward(data, "importance_sampling").result()
    client.optim_step(types.AdamParams(learning_rate=lr)).result()
    return statistics.mean(rewards)


def load_test(url: str, api_key: str, base_models: list[str], clients: int, rounds: int, tokenizer) -> list[float]:
    """``clients`` SDK clients at once, one training client each (spread over ``base_models``), each sending
    ``rounds`` x (forward_backward, optim_step) back to back, then reading every result. Returns each request's
    latency from submission to result, in seconds; raises if any client failed."""
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    data = sft_data(tokenizer, ARITHMETIC[:2])

    def one_client(index: int) -> None:
        try:
            with tinker.ServiceClient(base_url=url, api_key=api_key) as service:  # finishes the session on exit
                client = service.create_lora_training_client(base_model=base_models[index % len(base_models)], rank=8).result()
                submitted = []
                for _ in range(rounds):
                    submitted.append((time.monotonic(), client.forward_backward(data, "cross_entropy")))
                    submitted.append((time.monotonic(), client.optim_step(types.AdamParams(learning_rate=1e-3))))
                for start, future in submitted:
                    future.result()
                    with lock:
                        latencies.append(time.monotonic() - start)
        except BaseException as error:  # noqa: BLE001 - reported below, with every other client's
            errors.append(error)

    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return latencies


DatumLoss = Callable[[torch.Tensor, types.Datum], torch.Tensor]  # (a datum's target log-probs [N], the datum) -> loss


def nll(logprobs: torch.Tensor, datum: types.Datum) -> torch.Tensor:
    """The summed negative log-likelihood of a datum's targets (``cross_entropy`` without weights)."""
    return -logprobs.sum()


class HealthPoller:
    """Polls ``GET /api/v1/healthz`` every ``interval_s`` while the ``with`` block runs; ``latencies`` holds each
    answer's time in seconds, and ``failures`` every answer that was not a 200 within ``timeout_s``."""

    def __init__(self, url: str, api_key: str, interval_s: float = 0.2, timeout_s: float = 2.0) -> None:
        self.url, self.api_key, self.interval_s, self.timeout_s = url, api_key, interval_s, timeout_s
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            start = time.monotonic()
            try:
                status = httpx.get(f"{self.url}/api/v1/healthz", headers={"X-API-Key": self.api_key},
                                   timeout=self.timeout_s).status_code
            except httpx.HTTPError as error:
                self.failures.append(f"{type(error).__name__}: {error}")
                continue
            self.latencies.append(time.monotonic() - start)
            if status != 200:
                self.failures.append(f"status {status}")

    def __enter__(self) -> "HealthPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def peft_adamw_run(base_path, adapter_folder, data: list, adam: types.AdamParams,
                   step_losses: Sequence[DatumLoss]) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The reference: the saved adapters in plain peft (``adapter_folder`` None: the HF model itself, every weight
    trained), one ``torch.optim.AdamW`` step per entry of ``step_losses``, each on the sum of its loss over
    ``data``. Returns the trained parameters and each step's loss."""
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    if adapter_folder is not None:
        model = PeftModel.from_pretrained(model, adapter_folder, is_trainable=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                                  weight_decay=adam.weight_decay)
    losses = []
    for datum_loss in step_losses:
        loss = 0
        for datum in data:
            logits = model(torch.tensor([datum.model_input.to_ints()])).logits[0]
            targets = torch.tensor(datum.loss_fn_inputs["target_tokens"].tolist())
            loss = loss + datum_loss(logits.log_softmax(-1).gather(-1, targets[:, None])[:, 0], datum)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return {name: param.detach() for name, param in model.named_parameters() if param.requires_grad}, losses


def peft_adamw_steps(base_path, adapter_folder, data: list, steps: int, adam: types.AdamParams) -> dict[str, torch.Tensor]:
    """``peft_adamw_run`` with ``steps`` steps of summed NLL: the trained adapters."""
    return peft_adamw_run(base_path, adapter_folder, data, adam, [nll] * steps)[0]
