"""Tinker ``asample`` requests as rollout prompts, and the rollout's samples as a ``SampleResponse``.

``sampling_params`` map onto the rollout's per-request sampling keys: ``max_tokens`` ->
``max_new_tokens``, ``temperature`` 0 -> greedy, ``top_k``/``top_p``/``seed`` as they are, and
``stop`` as text stops (strings) or stop token ids (integers). A sample ends at its first stop,
which it includes, as at an EOS token. ``prompt_logprobs`` and ``topk_prompt_logprobs`` (``compute_logprobs``
among them; ``prompt_logprobs_last_n`` scores a suffix) come from the sampler's replica scoring the prompt
(``BaseRollout.score_prompts``: the model's own distribution, as the training forward's); top-k log-probs of the
sampled tokens, alternative-token draws and target log-probs are refused.

Requests with equal ``batch_key`` may run as one rollout call (``HostScheduler``): ``rollout_prompts``
left-pads their prompts into one batch, and ``sample_outcomes`` hands each request its own rows.
A request with a ``seed`` has no batch key: it runs alone, so its samples do not depend on what
else was queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import Any, Hashable, Optional

import numpy as np

from rlflow.errors import UserError
from rlflow.meta_info import SAMPLING
from rlflow.protocol import DataProto
from rlflow.rollout.processing import left_pad
from rlflow.rollout.prompt_scores import PROMPT_LOG_PROBS, PROMPT_TOPK_IDS, PROMPT_TOPK_LOG_PROBS
from rlflow.service.catalogue import BaseModel, check_token_ids
from rlflow.service.futures import Payload
from rlflow.service.wire import PROTOBUF, TOPK_SENTINEL_LOGPROB, SampledSequence, TopkArrays, encode_sample_response


MAX_PROMPT_TOP_K = 20  # vLLM's default max_logprobs
UNSUPPORTED_OPTIONS = {  # asample options this server refuses, and why
    "topk_sample_logprobs": "the rollout returns each sampled token's own log-prob only",
    "prompt_alt_tokens_k": "alternative-token draws are not implemented",
    "target_prompt_logprobs": "log-probs of chosen ids at prompt positions are not implemented; use topk_prompt_logprobs",
}


class SamplingRequestError(UserError, ValueError):
    """An ``asample`` request the service cannot run: bad parameters, a prompt too long, an unsupported option."""


@dataclass
class SamplingRequest:
    """A decoded ``asample`` body."""

    sampling_session_id: str
    prompt: list[int]
    num_samples: int
    params: dict[str, Any] = field(default_factory=dict)
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    prompt_logprobs_last_n: Optional[int] = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "SamplingRequest":
        """Read an ``asample`` JSON body; ``SamplingRequestError`` names what is wrong."""
        for key, why in UNSUPPORTED_OPTIONS.items():
            if body.get(key):
                raise SamplingRequestError(f"unsupported: {key} ({why})")
        chunks = (body.get("prompt") or {}).get("chunks") or []
        if any(chunk.get("type", "encoded_text") != "encoded_text" for chunk in chunks):
            raise SamplingRequestError("prompt chunks other than encoded_text (images) are not supported")
        prompt = [int(token) for chunk in chunks for token in chunk.get("tokens", [])]
        num_samples = int(body.get("num_samples", 1))
        if not prompt or num_samples < 1:
            raise SamplingRequestError(f"asample needs a non-empty prompt and num_samples >= 1 (got {len(prompt)} tokens, "
                                       f"{num_samples} samples)")
        top_k, last_n = int(body.get("topk_prompt_logprobs") or 0), body.get("prompt_logprobs_last_n")
        return cls(str(body.get("sampling_session_id")), prompt, num_samples, dict(body.get("sampling_params") or {}),
                   bool(body.get("prompt_logprobs")), top_k, None if last_n is None else int(last_n))

    @property
    def scores_prompt(self) -> bool:
        """Whether the response carries prompt log-probs or top-k prompt log-probs."""
        return self.prompt_logprobs or self.topk_prompt_logprobs > 0

    @cached_property
    def rollout_sampling(self) -> dict[str, Any]:
        """The rollout's per-request sampling keys (``RolloutMethods.generate_sequences``' ``meta_info`` ``SAMPLING``)."""
        params = self.params
        stop = params.get("stop")
        stops = [stop] if isinstance(stop, (str, int)) else list(stop or [])
        temperature = float(params.get("temperature", 1.0))
        return {
            "n": self.num_samples,
            "do_sample": temperature > 0,
            "temperature": temperature if temperature > 0 else 1.0,
            "top_p": float(params.get("top_p", 1.0)),
            "top_k": int(params.get("top_k", -1)),
            "max_new_tokens": int(params.get("max_tokens") or 0),
            "seed": params.get("seed"),
            "stop": [s for s in stops if isinstance(s, str)],
            "stop_token_ids": [int(s) for s in stops if not isinstance(s, str)],
        }

    @cached_property
    def batch_key(self) -> Optional[Hashable]:
        """What requests must share to run in one rollout call (their sampling, stops included); None with a seed or
        prompt scoring (such a request runs alone)."""
        sampling = self.rollout_sampling
        if sampling["seed"] is not None or self.scores_prompt:
            return None
        return tuple(sorted((key, tuple(value) if isinstance(value, list) else value) for key, value in sampling.items()))

    def check(self, max_seq_len: int, vocab_size: int) -> None:
        """Refuse ``max_tokens`` < 1, a prompt plus ``max_tokens`` over the context, a prompt token outside the
        model's vocabulary, a top-k over ``MAX_PROMPT_TOP_K`` and a ``prompt_logprobs_last_n`` outside the prompt
        (``SamplingRequestError``)."""
        check_token_ids(self.prompt, vocab_size, "the prompt", SamplingRequestError)
        max_new_tokens = self.rollout_sampling["max_new_tokens"]
        if max_new_tokens < 1:
            raise SamplingRequestError("sampling_params.max_tokens must be >= 1")
        if len(self.prompt) + max_new_tokens > max_seq_len:
            raise SamplingRequestError(f"the prompt's {len(self.prompt)} tokens plus max_tokens={max_new_tokens} "
                                       f"exceed the model's context of {max_seq_len} tokens")
        if not 0 <= self.topk_prompt_logprobs <= MAX_PROMPT_TOP_K:
            raise SamplingRequestError(f"topk_prompt_logprobs must be 0..{MAX_PROMPT_TOP_K}, got {self.topk_prompt_logprobs}")
        last_n = self.prompt_logprobs_last_n
        if last_n is not None and not (self.scores_prompt and 1 <= last_n <= len(self.prompt) - 1):
            raise SamplingRequestError(f"prompt_logprobs_last_n={last_n} needs prompt_logprobs or topk_prompt_logprobs and "
                                       f"must be 1..{len(self.prompt) - 1} (the prompt's length - 1)")


def rollout_prompts(requests: list[SamplingRequest], pad_token_id: int) -> DataProto:
    """The prompts of ``requests`` (equal ``batch_key``, or just one) as one left-padded batch, the first
    request's sampling in ``meta_info``."""
    width = max(len(request.prompt) for request in requests)
    ids, mask = left_pad([request.prompt for request in requests], width, pad_token_id)
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask,
                                   "position_ids": (mask.cumsum(dim=1) - 1).clamp(min=0)})
    prompts.meta_info = {SAMPLING.name: requests[0].rollout_sampling}
    return prompts


def sample_outcomes(output: DataProto, requests: list[SamplingRequest], base: BaseModel) -> list[Payload]:
    """Each request's ``SampleResponse`` from the rollout's output for ``rollout_prompts(requests)``: its
    ``num_samples`` rows, in request order (a prompt's samples are adjacent)."""
    counts = [request.num_samples for request in requests]
    if len(output) != sum(counts):
        raise RuntimeError(f"the rollout returned {len(output)} samples; the {len(requests)} requests asked for {sum(counts)}")
    starts = accumulate(counts, initial=0)
    return [sample_outcome(output[start:start + count], request, base)
            for start, count, request in zip(starts, counts, requests)]


def sample_outcome(output: DataProto, request: SamplingRequest, base: BaseModel, scores: Optional[DataProto] = None) -> Payload:
    """The ``SampleResponse`` of ``request``'s rows of the rollout's output (a sample stopped if it ended on an end
    token or before ``max_tokens``), with the prompt's scores when it asked for them (``scores``: the replica's
    ``rlflow.rollout.prompt_scores`` columns of ``rollout_prompts([request])``)."""
    sampling = request.rollout_sampling
    end_ids = base.end_token_ids | set(sampling["stop_token_ids"])
    sequences = []
    for row in range(len(output)):
        keep = output.batch["response_mask"][row].bool()
        tokens = output.batch["responses"][row][keep].tolist()
        logprobs = output.batch["rollout_log_probs"][row][keep].tolist()
        stopped = len(tokens) < sampling["max_new_tokens"] or bool(tokens and tokens[-1] in end_ids)
        sequences.append(SampledSequence(tokens, logprobs, stopped))
    if scores is None:
        return PROTOBUF, encode_sample_response(sequences)
    return PROTOBUF, encode_sample_response(sequences, *prompt_score_arrays(scores, request))


def prompt_score_arrays(scores: DataProto, request: SamplingRequest) -> tuple[Optional[np.ndarray], Optional[TopkArrays]]:
    """``request``'s prompt log-probs (NaN where unscored: the first token, and the tokens before
    ``prompt_logprobs_last_n``) and its top-k ids and log-probs (the SDK's sentinel where unscored), each None when
    not asked for, from the one-row ``scores`` of its prompt."""
    log_probs = scores.batch[PROMPT_LOG_PROBS][0].numpy().astype(np.float32)
    if request.prompt_logprobs_last_n is not None:
        log_probs[: len(log_probs) - request.prompt_logprobs_last_n] = np.nan
    top = None
    if request.topk_prompt_logprobs > 0:
        unscored = np.isnan(log_probs)
        ids = scores.batch[PROMPT_TOPK_IDS][0].numpy().astype(np.int32)
        values = scores.batch[PROMPT_TOPK_LOG_PROBS][0].numpy().astype(np.float32)
        ids[unscored], values[unscored] = 0, TOPK_SENTINEL_LOGPROB
        top = TopkArrays(ids, values)
    return (log_probs if request.prompt_logprobs else None), top
