"""Tinker ``asample`` requests as rollout prompts, and the rollout's samples as a ``SampleResponse``.

``sampling_params`` map onto the rollout's per-request sampling keys: ``max_tokens`` ->
``max_new_tokens``, ``temperature`` 0 -> greedy, ``top_k``/``top_p``/``seed`` as they are, and
``stop`` as text stops (strings) or stop token ids (integers). A sample ends at its first stop,
which it includes, as at an EOS token. ``prompt_logprobs`` are not computed (the rollout returns
the log-probs of sampled tokens only), so ``compute_logprobs`` is refused.

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

from rlflow.errors import UserError
from rlflow.meta_info import SAMPLING
from rlflow.protocol import DataProto
from rlflow.rollout.processing import left_pad
from rlflow.service.catalogue import BaseModel
from rlflow.service.futures import Payload
from rlflow.service.wire import PROTOBUF, SampledSequence, encode_sample_response


class SamplingRequestError(UserError, ValueError):
    """An ``asample`` request the service cannot run: bad parameters, a prompt too long, an unsupported option."""


@dataclass
class SamplingRequest:
    """A decoded ``asample`` body."""

    sampling_session_id: str
    prompt: list[int]
    num_samples: int
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "SamplingRequest":
        """Read an ``asample`` JSON body; ``SamplingRequestError`` names what is wrong."""
        if body.get("prompt_logprobs") or body.get("topk_prompt_logprobs") or body.get("topk_sample_logprobs") \
                or body.get("prompt_alt_tokens_k"):
            raise SamplingRequestError("prompt log-probs and top-k log-probs are not supported by this server "
                                       "(compute_logprobs included); sampled tokens' log-probs always come back")
        chunks = (body.get("prompt") or {}).get("chunks") or []
        if any(chunk.get("type", "encoded_text") != "encoded_text" for chunk in chunks):
            raise SamplingRequestError("prompt chunks other than encoded_text (images) are not supported")
        prompt = [int(token) for chunk in chunks for token in chunk.get("tokens", [])]
        num_samples = int(body.get("num_samples", 1))
        if not prompt or num_samples < 1:
            raise SamplingRequestError(f"asample needs a non-empty prompt and num_samples >= 1 (got {len(prompt)} tokens, "
                                       f"{num_samples} samples)")
        return cls(str(body.get("sampling_session_id")), prompt, num_samples, dict(body.get("sampling_params") or {}))

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
        """What requests must share to run in one rollout call (their sampling, stops included); None with a seed."""
        sampling = self.rollout_sampling
        if sampling["seed"] is not None:
            return None
        return tuple(sorted((key, tuple(value) if isinstance(value, list) else value) for key, value in sampling.items()))

    def check(self, max_seq_len: int) -> None:
        """Refuse ``max_tokens`` < 1 and a prompt plus ``max_tokens`` over the context (``SamplingRequestError``)."""
        max_new_tokens = self.rollout_sampling["max_new_tokens"]
        if max_new_tokens < 1:
            raise SamplingRequestError("sampling_params.max_tokens must be >= 1")
        if len(self.prompt) + max_new_tokens > max_seq_len:
            raise SamplingRequestError(f"the prompt's {len(self.prompt)} tokens plus max_tokens={max_new_tokens} "
                                       f"exceed the model's context of {max_seq_len} tokens")


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


def sample_outcome(output: DataProto, request: SamplingRequest, base: BaseModel) -> Payload:
    """The ``SampleResponse`` of ``request``'s rows of the rollout's output (a sample stopped if it ended on an end
    token or before ``max_tokens``)."""
    sampling = request.rollout_sampling
    end_ids = base.end_token_ids | set(sampling["stop_token_ids"])
    sequences = []
    for row in range(len(output)):
        keep = output.batch["response_mask"][row].bool()
        tokens = output.batch["responses"][row][keep].tolist()
        logprobs = output.batch["rollout_log_probs"][row][keep].tolist()
        stopped = len(tokens) < sampling["max_new_tokens"] or bool(tokens and tokens[-1] in end_ids)
        sequences.append(SampledSequence(tokens, logprobs, stopped))
    return PROTOBUF, encode_sample_response(sequences)
