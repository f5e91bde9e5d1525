"""The HF backend: batched ``model.generate`` with left padding, for the smallest models and for tests.

With ``rollout.calculate_log_probs`` the scores are kept and the log-probs follow
``rollout.logprobs_mode`` exactly as vLLM defines it (without it, generate keeps no scores):

* ``processed_logprobs``: ``log_softmax`` of the scores generate sampled from (after temperature,
  top-k and top-p; with greedy decoding, the raw logits);
* ``raw_logprobs``: ``log_softmax`` of the raw logits.

The model's own ``generation_config`` defaults (repetition penalty, top-k 50 ...) are replaced by
a neutral one, so only the rollout's sampling parameters shape the distribution, as in vLLM.

The batched ``generate`` seeds each ``generate`` call of up to ``rollout.max_num_seqs`` rows. The
request level is its simple equivalent: each ``step`` runs the queued requests that share the first
one's sampling as one ``generate`` call to the end, seeded with that request's seed, so a request's
sample depends on what it was batched with (vLLM's per-request seeds do not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from rlflow.models.loading import load_causal_lm
from rlflow.rollout.base import ROLLOUT_REGISTRY, BaseRollout, SeedKey
from rlflow.rollout.processing import ResponseEnd
from rlflow.rollout.prompt_scores import PromptScores, scores_from_logits
from rlflow.rollout.requests import Completion, GenerationRequest
from rlflow.rollout.sampling import Sampling, request_seed
from rlflow.rollout.weight_sync import NamedTensors


class _StopAtResponseEnd(StoppingCriteria):
    """Marks a row finished once its response contains a stop string (``ResponseEnd`` decides)."""

    def __init__(self, end: ResponseEnd, prompt_width: int):
        self.end, self.prompt_width = end, prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        responses = input_ids[:, self.prompt_width :].tolist()
        return torch.tensor([self.end.end(row) is not None for row in responses], device=input_ids.device)


class _AllowOnly(LogitsProcessor):
    """Restricts sampling to ``allowed`` token ids (a request's ``allowed_token_ids``)."""

    def __init__(self, allowed: Iterable[int]):
        self.allowed = torch.as_tensor(sorted(set(allowed)), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        masked = torch.full_like(scores, float("-inf"))
        index = self.allowed.to(scores.device)
        return masked.index_copy(1, index, scores.index_select(1, index))


@ROLLOUT_REGISTRY.register("hf")
class HFRollout(BaseRollout):
    """Rollout with Hugging Face ``generate`` on the rollout's own copy of the model."""

    def __init__(self, config: Any, model_path: str | Path, device: str | torch.device = "auto", replica_rank: int = 0):
        super().__init__(config, model_path, device, replica_rank)
        self.model = load_causal_lm(self.model_path, dtype=config.dtype, trust_remote_code=bool(config.trust_remote_code))
        self.model = self.model.to(self.device).eval()
        self.model.generation_config = GenerationConfig(
            eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_token_id, bos_token_id=None
        )
        self._queued: dict[str, GenerationRequest] = {}

    def _generation_config(self, sampling: Sampling) -> GenerationConfig:
        processed = self.calculate_log_probs and self.logprobs_mode == "processed_logprobs"
        raw = self.calculate_log_probs and not processed
        warpers = {} if sampling.greedy else {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": max(sampling.top_k, 0),  # 0: off
        }
        return GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            eos_token_id=sorted(self.end_token_ids(sampling)),
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_scores=processed,
            output_logits=raw,
            **warpers,
        )

    def _sample(
        self, prompts: list[list[int]], sampling: Sampling, seed_key: SeedKey
    ) -> tuple[list[list[int]], Optional[list[list[float]]]]:
        expanded = [prompt for prompt in prompts for _ in range(sampling.n)]
        generation_config = self._generation_config(sampling)
        batch_size = int(self.config.max_num_seqs)
        responses, log_probs = [], []
        for index, start in enumerate(range(0, len(expanded), batch_size)):
            seed = None if seed_key is None else request_seed(*seed_key, index)
            batch = expanded[start : start + batch_size]
            tokens, values = self._generate_batch(batch, sampling, generation_config, seed)
            responses += tokens
            log_probs += values or []
        return responses, log_probs if self.calculate_log_probs else None

    # ------------------------------------------------------------------ request level
    def add_request(self, request_id: str, request: GenerationRequest) -> None:
        self._queued[request_id] = request

    def step(self) -> list[tuple[str, Completion]]:
        """Runs the queued requests that share the first one's sampling (up to ``max_num_seqs``) to the end."""
        if not self._queued:
            return []
        first = next(iter(self._queued.values()))
        key = (first.sampling, first.allowed_token_ids)
        batch = [rid for rid, r in self._queued.items() if (r.sampling, r.allowed_token_ids) == key]
        batch = batch[: int(self.config.max_num_seqs)]
        requests = [self._queued.pop(rid) for rid in batch]
        sampling = first.sampling
        tokens, values = self._generate_batch(
            [list(r.prompt_ids) for r in requests], sampling, self._generation_config(sampling), first.seed,
            first.allowed_token_ids,
        )
        end = ResponseEnd(self.end_token_ids(sampling), sampling.stop, self.tokenizer)
        finished = []
        for index, (request_id, row) in enumerate(zip(batch, tokens)):
            stop = end.end(row)
            keep = len(row) if stop is None else stop
            log_probs = None if values is None else tuple(values[index][:keep])
            finished.append((request_id, Completion(tuple(row[:keep]), log_probs, "length" if stop is None else "stop")))
        return finished

    def abort(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._queued.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self._queued)

    def _generate_batch(
        self, prompts: list[list[int]], sampling: Sampling, generation_config: GenerationConfig, seed: int | None,
        allowed_token_ids: Optional[tuple[int, ...]] = None,
    ) -> tuple[list[list[int]], Optional[list[list[float]]]]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.as_tensor(prompt)
            attention_mask[i, width - len(prompt) :] = 1
        stopping = None
        if sampling.stop:
            end = ResponseEnd(self.end_token_ids(sampling), sampling.stop, self.tokenizer)
            stopping = StoppingCriteriaList([_StopAtResponseEnd(end, width)])
        rng_devices = [] if self.device.type == "cpu" else [self.device]
        with torch.no_grad(), torch.random.fork_rng(devices=rng_devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=generation_config,
                stopping_criteria=stopping,
                logits_processor=None if allowed_token_ids is None else LogitsProcessorList([_AllowOnly(allowed_token_ids)]),
            )
        generated = out.sequences[:, width:]
        if not self.calculate_log_probs:
            return generated.cpu().tolist(), None
        scores = torch.stack(out.scores if out.scores is not None else out.logits, dim=1)
        token_log_probs = scores.float().log_softmax(dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
        return generated.cpu().tolist(), token_log_probs.cpu().tolist()

    def score_prompts(self, prompts: list[tuple[int, ...]], top_k: int = 0) -> list[PromptScores]:
        """One forward of the right-padded prompts, ``max_num_seqs`` at a time (``BaseRollout.score_prompts``)."""
        self.check_weights()
        scores: list[PromptScores] = []
        for start in range(0, len(prompts), int(self.config.max_num_seqs)):
            batch = prompts[start : start + int(self.config.max_num_seqs)]
            width = max(len(prompt) for prompt in batch)
            input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros_like(input_ids)
            for row, prompt in enumerate(batch):
                input_ids[row, : len(prompt)] = torch.as_tensor(prompt)
                attention_mask[row, : len(prompt)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)).logits
            scores += [scores_from_logits(prompt, logits[row, : len(prompt)], top_k) for row, prompt in enumerate(batch)]
        return scores

    def _load_weights(self, named_tensors: NamedTensors) -> None:
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in named_tensors:
                state[name].copy_(tensor)
