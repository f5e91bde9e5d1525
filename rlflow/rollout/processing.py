"""Pre- and post-processing shared by every rollout backend.

In: a DataProto of left-padded prompts (``input_ids``, ``attention_mask``, ``position_ids`` plus
non-tensor columns such as ``uid``). ``prompt_token_lists`` strips the padding and
``fit_prompts`` applies the prompt-overflow policy.

Out: ``build_rollout_output`` turns per-sample response tokens and log-probs into the rollout
DataProto. ``ResponseEnd`` decides where each response ends (EOS or a stop string, that token
included), so both backends cut responses by one rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch

from rlflow.errors import UserError
from rlflow.models.hf_checkpoint import ModelFileError
from rlflow.protocol import DataProto
from rlflow.rollout.sampling import Sampling
from rlflow.utils.text_files import read_json

PROMPT_OVERFLOW_POLICIES = ("error", "truncate_left")
PROMPT_KEYS = ("input_ids", "attention_mask")
OUTPUT_TENSOR_KEYS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
)
LOG_PROB_KEY = "rollout_log_probs"  # present when rollout.calculate_log_probs


class PromptTooLongError(UserError, ValueError):
    """A prompt plus its response budget does not fit the engine's ``max_model_len``."""


def prompt_token_lists(prompts: DataProto) -> list[list[int]]:
    """The real (unpadded) token ids of each prompt row, from ``input_ids`` and ``attention_mask``."""
    missing = [key for key in PROMPT_KEYS if key not in prompts.batch]
    if missing:
        raise ValueError(f"rollout prompts need tensors {list(PROMPT_KEYS)}; missing {missing} in {prompts!r}")
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    tokens = [row[keep].tolist() for row, keep in zip(ids, mask)]
    empty = [i for i, row in enumerate(tokens) if not row]
    if empty:
        raise ValueError(f"prompt rows {empty[:8]} are empty (attention_mask all 0); drop them before generation")
    return tokens


def fit_prompts(
    tokens: list[list[int]], max_new_tokens: int, max_model_len: int, policy: str
) -> list[list[int]]:
    """Apply ``rollout.prompt_overflow`` to prompts whose length + ``max_new_tokens`` exceeds ``max_model_len``.

    ``error`` raises ``PromptTooLongError`` naming the first offending row; ``truncate_left``
    keeps each such prompt's last ``max_model_len - max_new_tokens`` tokens.
    """
    if policy not in PROMPT_OVERFLOW_POLICIES:
        raise ValueError(f"rollout.prompt_overflow must be one of {PROMPT_OVERFLOW_POLICIES}, got {policy!r}")
    budget = max_model_len - max_new_tokens
    if budget < 1:
        raise PromptTooLongError(
            f"max_new_tokens={max_new_tokens} leaves no room for a prompt in max_model_len={max_model_len}; "
            "raise rollout.max_model_len or lower the response length"
        )
    too_long = [i for i, row in enumerate(tokens) if len(row) > budget]
    if not too_long:
        return tokens
    if policy == "error":
        row = too_long[0]
        raise PromptTooLongError(
            f"prompt row {row} has {len(tokens[row])} tokens; with max_new_tokens={max_new_tokens} it needs "
            f"{len(tokens[row]) + max_new_tokens} > rollout.max_model_len={max_model_len} ({len(too_long)} rows "
            "overflow). Raise rollout.max_model_len, filter long prompts (data.max_prompt_length), or set "
            "rollout.prompt_overflow=truncate_left"
        )
    return [row[-budget:] if len(row) > budget else row for row in tokens]


def eos_token_ids(model_path: str | Path, tokenizer) -> frozenset[int]:
    """Token ids that end a response: the tokenizer's EOS plus ``generation_config.json``'s ``eos_token_id``."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    generation_config = Path(model_path) / "generation_config.json"
    if generation_config.is_file():
        generation = read_json(generation_config, ModelFileError)
        eos = generation.get("eos_token_id") if isinstance(generation, dict) else None
        ids.update(int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None)
    if not ids:
        raise ValueError(f"no EOS token id in the tokenizer or generation_config.json of {model_path}; set one")
    return frozenset(ids)


@dataclass(frozen=True)
class ResponseEnd:
    """Where a response ends: just after the first EOS token or the token that completes a stop string.

    Stop strings are matched on the decoded response text (special tokens skipped, as vLLM
    does): the response ends at the first token whose decoded prefix contains a stop string.
    """

    end_ids: frozenset[int]  # EOS tokens and any stop token ids
    stop: tuple[str, ...]
    tokenizer: object

    def end(self, response: Sequence[int]) -> int | None:
        """Tokens up to and including the end token, or None if ``response`` has not ended."""
        eos = next((i + 1 for i, token in enumerate(response) if token in self.end_ids), None)
        limit = len(response) if eos is None else eos
        if self.stop and self._has_stop(response[:limit]):
            return next(k for k in range(1, limit + 1) if self._has_stop(response[:k]))
        return eos

    def length(self, response: Sequence[int]) -> int:
        """Number of tokens to keep: through the end token, or all of them if there is none."""
        end = self.end(response)
        return len(response) if end is None else end

    def _has_stop(self, tokens: Sequence[int]) -> bool:
        text = self.tokenizer.decode(list(tokens), skip_special_tokens=True)
        return any(stop in text for stop in self.stop)


def left_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` of token ids left-padded with ``pad_id`` to ``width``: the ids and the attention mask."""
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.as_tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids, mask


def _right_pad(rows: Sequence[Sequence], width: int, pad_value, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), pad_value, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
    return out


def build_rollout_output(
    prompts: DataProto,
    prompt_tokens: list[list[int]],
    responses: list[list[int]],
    log_probs: Optional[list[list[float]]],
    sampling: Sampling,
    pad_token_id: int,
    response_masks: Optional[list[list[int]]] = None,
) -> DataProto:
    """The rollout DataProto for ``len(prompts) * sampling.n`` samples (a prompt's samples adjacent).

    ``responses[j]``/``log_probs[j]`` belong to prompt ``j // n``, already cut at their end.
    Tensors: ``prompts`` (left-padded to the input width), ``responses`` and ``response_mask``
    (right-padded to ``max_new_tokens``), ``input_ids``/``attention_mask``/``position_ids`` over
    prompt + response, and with ``log_probs`` (None: none were computed) ``rollout_log_probs``
    (right-padded; log-prob 0 on padding). ``response_masks`` (None: every response token is the
    model's) marks the tokens the loss sees; the tool and environment tokens of a multi-turn
    trajectory are 0 there but 1 in ``attention_mask``. Every other input column (``uid``,
    ``ground_truth`` ...) is repeated ``n`` times; meta_info is kept.
    """
    n, width = sampling.n, sampling.max_new_tokens
    if len(responses) != len(prompt_tokens) * n or (log_probs is not None and len(log_probs) != len(responses)):
        raise RuntimeError(f"rollout produced {len(responses)} responses for {len(prompt_tokens)} prompts x n={n}")
    prompt_width = prompts.batch["input_ids"].shape[1] if "input_ids" in prompts.batch else 0
    prompt_ids, prompt_mask = left_pad([row for row in prompt_tokens for _ in range(n)], prompt_width, pad_token_id)
    response_ids = _right_pad(responses, width, pad_token_id, torch.long)
    attended = _right_pad([[1] * len(r) for r in responses], width, 0, torch.long)
    response_mask = attended if response_masks is None else _right_pad(response_masks, width, 0, torch.long)
    prompt_positions = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)
    last = prompt_positions[:, -1:] if prompt_width else torch.full((len(responses), 1), -1, dtype=torch.long)
    response_positions = last + torch.arange(1, width + 1, dtype=torch.long)
    batch = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
        "attention_mask": torch.cat([prompt_mask, attended], dim=1),
        "position_ids": torch.cat([prompt_positions, response_positions], dim=1),
    }
    if log_probs is not None:
        batch[LOG_PROB_KEY] = _right_pad(log_probs, width, 0.0, torch.float32)
    passthrough = prompts.select(
        [k for k in prompts.batch if k not in batch], list(prompts.non_tensor_batch)
    ).repeat(n, interleave=True)
    output = DataProto.from_dict(batch, meta_info=dict(prompts.meta_info))
    output.batch.update(passthrough.batch)
    output.non_tensor_batch.update(passthrough.non_tensor_batch)
    output.check_consistency()
    return output


def cut_responses(
    responses: Iterable[Sequence[int]], log_probs: Optional[Iterable[Sequence[float]]], end: ResponseEnd
) -> tuple[list[list[int]], Optional[list[list[float]]]]:
    """Cut each response (and its log-probs, if any) just after its end token."""
    responses = [list(tokens) for tokens in responses]
    keep = [end.length(tokens) for tokens in responses]
    cut_tokens = [tokens[:count] for tokens, count in zip(responses, keep)]
    if log_probs is None:
        return cut_tokens, None
    return cut_tokens, [list(values[:count]) for values, count in zip(log_probs, keep)]
