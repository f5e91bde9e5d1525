"""Helpers shared by the rollout tests: prompt batches and an independent HF-forward log-prob reference."""

from __future__ import annotations

from dataclasses import replace

import torch

from rlflow.config.schema import RolloutConfig
from rlflow.protocol import DataProto

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "12+30=",
    "You are a helpful assistant. Please think step by step, then give the final answer to 7*8.",
]


def rollout_config(name: str, **overrides) -> RolloutConfig:
    """A small engine: short lengths, a 64 MiB KV cache, log-probs returned."""
    base = RolloutConfig(name=name, prompt_length=48, response_length=8, n=1, kv_cache_space_gb=0.0625,
                         calculate_log_probs=True)
    return replace(base, **overrides)


def make_prompts(tokenizer, texts=PROMPTS, token_lists=None, **non_tensors) -> DataProto:
    """Left-padded prompt batch like the data pipeline makes, with a uid per row."""
    rows = token_lists if token_lists is not None else [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max((len(r) for r in rows), default=1)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    columns = {"uid": [f"uid-{i}" for i in range(len(rows))], **non_tensors}
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": positions}, columns)


def reference_log_probs(
    model, output: DataProto, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0
) -> list[torch.Tensor]:
    """Per row: log-prob of each response token under the filtered, temperature-scaled distribution.

    One unpadded HF forward per sequence, in float64 after the model's fp32 logits.
    """
    result = []
    for prompt, prompt_mask, response, response_mask in zip(
        output.batch["prompts"],
        output.batch["attention_mask"][:, : output.batch["prompts"].shape[1]],
        output.batch["responses"],
        output.batch["response_mask"],
    ):
        prompt_tokens = prompt[prompt_mask.bool()]
        response_tokens = response[response_mask.bool()]
        sequence = torch.cat([prompt_tokens, response_tokens])[None]
        with torch.no_grad():
            logits = model(sequence).logits[0].double()
        steps = filtered_log_softmax(logits[len(prompt_tokens) - 1 : -1], temperature, top_k, top_p)
        result.append(steps.gather(-1, response_tokens[:, None])[:, 0])
    return result


def max_log_prob_error(model, output: DataProto, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0) -> float:
    """Largest |rollout_log_probs - reference| over all response tokens of ``output``."""
    worst = 0.0
    for row, reference in enumerate(reference_log_probs(model, output, temperature, top_k, top_p)):
        got = output.batch["rollout_log_probs"][row, : len(reference)].double()
        worst = max(worst, (got - reference).abs().max().item())
    return worst


def perturbed_state(model, scale: float = 0.05, seed: int = 1) -> dict[str, torch.Tensor]:
    """The model's weights plus seeded noise (a stand-in for training updates)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + scale * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
        for name, tensor in model.state_dict().items()
    }


def filtered_log_softmax(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """log-probs of the sampling distribution: logits / T, keep the top k, then the smallest set with mass >= p."""
    scaled = logits / temperature
    if top_k > 0:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        probs, order = scaled.softmax(-1).sort(dim=-1, descending=True)
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled.log_softmax(-1)
