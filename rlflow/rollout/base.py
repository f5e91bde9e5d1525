"""``BaseRollout``: the interface every generation backend implements, and the backend registry.

A backend implements the request level (``add_request`` / ``step`` / ``abort`` /
``has_unfinished``: one prompt's token ids in, one sampled response out, with per-token log-probs
when ``rollout.calculate_log_probs`` asks for them) and ``_load_weights``. The batched ``generate``
is one client of the request level (another backend may override ``_sample`` with its own batched
equivalent, as ``hf`` does); the agent loops' ``RequestServer`` is another. Prompt unpadding, the
overflow policy, response ends, seeds and the output DataProto are shared
(``rlflow.rollout.processing``), so every backend returns the same layout. Add a backend with
``@ROLLOUT_REGISTRY.register("name")`` on its class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Iterable, Optional

import torch

from rlflow.config.validation import ConfigError
from rlflow.meta_info import GLOBAL_STEP
from rlflow.models.loading import load_tokenizer
from rlflow.protocol import DataProto
from rlflow.rollout.processing import (
    ResponseEnd,
    build_rollout_output,
    cut_responses,
    eos_token_ids,
    fit_prompts,
    prompt_token_lists,
)
from rlflow.rollout.prompt_scores import PromptScores
from rlflow.rollout.requests import Completion, GenerationRequest
from rlflow.rollout.sampling import Sampling, check_logprobs_mode, request_seed, resolve_sampling
from rlflow.rollout.weight_sync import CheckedWeightStream, NamedTensors, WeightSyncError, checkpoint_weight_names
from rlflow.utils.device import get_torch_device
from rlflow.utils.registry import Registry

SeedKey = Optional[tuple[int, ...]]


class BaseRollout(ABC):
    """Generates responses for a batch of prompts and takes new weights from the trainer.

    ``config`` is a ``RolloutConfig`` (dataclass or OmegaConf node); ``model_path`` an HF folder;
    ``replica_rank`` tells replicas apart so seeded sampling differs between them. A backend that
    applies LoRA adapters at generation (``rollout.lora_sync=adapter``) sets ``takes_lora_adapters``
    and implements ``update_lora_adapter``. A backend that splits its engine over tensor-parallel processes
    (``rollout.tensor_parallel_size`` > 1; ``rlflow.rollout.tensor_parallel``) sets ``runs_tensor_parallel``.
    """

    takes_lora_adapters: ClassVar[bool] = False
    runs_tensor_parallel: ClassVar[bool] = False

    def __init__(self, config: Any, model_path: str | Path, device: str | torch.device = "auto", replica_rank: int = 0):
        check_tensor_parallel_size(config)
        self.config = config
        self.model_path = str(model_path)
        self.device = device if isinstance(device, torch.device) else get_torch_device(str(device))
        self.replica_rank = replica_rank
        self.logprobs_mode = check_logprobs_mode(config.logprobs_mode)
        self.calculate_log_probs = bool(config.calculate_log_probs)
        self.max_model_len = int(config.max_model_len or config.prompt_length + config.response_length)
        self.tokenizer = load_tokenizer(self.model_path, trust_remote_code=bool(config.trust_remote_code))
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.eos_ids = eos_token_ids(self.model_path, self.tokenizer)
        self.weight_names = checkpoint_weight_names(self.model_path)
        self._weights_valid = True
        self._syncs_to_skip = int(getattr(config, "debug_skip_weight_sync_steps", 0) or 0)

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: DataProto, sampling: Any = None) -> DataProto:
        """``sampling.n`` responses per prompt row; ``sampling`` defaults to the config's training keys.

        ``GLOBAL_STEP`` in ``prompts.meta_info`` (default 0) enters the seeds, so each step samples
        afresh and a rerun with the same seed reproduces every step.
        """
        params, tokens, seed_key = self.prepare(prompts, sampling)
        if len(prompts) == 0:
            return build_rollout_output(prompts, [], [], [] if self.calculate_log_probs else None, params, self.pad_token_id)
        responses, log_probs = self._sample(tokens, params, seed_key)
        end = ResponseEnd(self.end_token_ids(params), params.stop, self.tokenizer)
        responses, log_probs = cut_responses(responses, log_probs, end)
        return build_rollout_output(prompts, tokens, responses, log_probs, params, self.pad_token_id)

    def prepare(self, prompts: DataProto, sampling: Any = None) -> tuple[Sampling, list[list[int]], SeedKey]:
        """What every client of a generation call starts from: the resolved sampling, the prompts' token ids
        after the overflow policy, and the seed key (None: unseeded). Raises while the weights are invalid."""
        self.check_weights()
        params = resolve_sampling(self.config if sampling is None else sampling, self.config.response_length)
        if len(prompts) == 0:
            return params, [], None
        tokens = fit_prompts(
            prompt_token_lists(prompts), params.max_new_tokens, self.max_model_len, self.config.prompt_overflow
        )
        seed_key = None
        if params.seed is not None:
            seed_key = (int(params.seed), GLOBAL_STEP.read(prompts.meta_info), self.replica_rank)
        return params, tokens, seed_key

    def end_token_ids(self, sampling: Sampling) -> frozenset[int]:
        """The tokens that end a response: the model's EOS tokens and ``sampling.stop_token_ids``."""
        return self.eos_ids | frozenset(sampling.stop_token_ids)

    def _sample(
        self, prompts: list[list[int]], sampling: Sampling, seed_key: SeedKey
    ) -> tuple[list[list[int]], Optional[list[list[float]]]]:
        """``sampling.n`` responses per prompt, prompt-major, with the log-prob of each sampled token when
        ``self.calculate_log_probs`` (else None: the engine was not asked for any).

        ``seed_key`` is None for unseeded sampling, else the integers every seed is mixed from (with the
        row and the sample). Responses may run past their end; the caller cuts them. This default sends
        one request per sample, in prompt-major order, through the request level.
        """
        once = replace(sampling, n=1)
        requests = {
            f"batch-{row}-{sample}": GenerationRequest(
                tuple(prompt), once, None if seed_key is None else request_seed(*seed_key, row, sample)
            )
            for row, prompt in enumerate(prompts)
            for sample in range(sampling.n)
        }
        done = self.run_requests(requests)
        completions = [done[request_id] for request_id in requests]
        responses = [list(completion.token_ids) for completion in completions]
        if not self.calculate_log_probs:
            return responses, None
        return responses, [list(completion.log_probs or ()) for completion in completions]

    # ------------------------------------------------------------------ request level
    @abstractmethod
    def add_request(self, request_id: str, request: GenerationRequest) -> None:
        """Queue ``request`` under ``request_id`` (unique among the unfinished ones); ``step`` serves it."""

    @abstractmethod
    def step(self) -> list[tuple[str, Completion]]:
        """Advance every queued request by one engine step; returns the requests that finished in it."""

    @abstractmethod
    def abort(self, request_ids: Iterable[str]) -> None:
        """Drop these requests (finished or unknown ids are ignored); no completion comes for them."""

    @abstractmethod
    def has_unfinished(self) -> bool:
        """Whether any queued request has not finished."""

    def track_partial_outputs(self, on: bool) -> None:
        """Keep each request's tokens as they are sampled, so ``abort_keeping`` can return them (a backend whose
        ``step`` runs its requests to the end has none to keep)."""

    def abort_keeping(self, request_ids: Iterable[str]) -> dict[str, Completion]:
        """Abort these requests and return what each sampled so far (``finish_reason`` ``abort``; no tokens
        unless ``track_partial_outputs`` is on and the backend keeps them)."""
        request_ids = list(request_ids)
        self.abort(request_ids)
        empty = Completion((), () if self.calculate_log_probs else None, "abort")
        return {request_id: empty for request_id in request_ids}

    def run_requests(self, requests: dict[str, GenerationRequest]) -> dict[str, Completion]:
        """Serve ``requests`` (id -> request) to completion, all queued at once, in the dict's order."""
        self.check_weights()
        for request_id, request in requests.items():
            self.add_request(request_id, request)
        done: dict[str, Completion] = {}
        while len(done) < len(requests):
            if not self.has_unfinished():
                lost = sorted(set(requests) - set(done))[:4]
                raise RuntimeError(f"the {self.config.name} rollout dropped requests {lost} without finishing them")
            done.update((request_id, c) for request_id, c in self.step() if request_id in requests)
        return done

    def score_prompts(self, prompts: list[tuple[int, ...]], top_k: int = 0) -> list[PromptScores]:
        """Each prompt's tokens scored by the model's own distribution (no sampling settings), with its ``top_k``
        most likely tokens at each position (``rlflow.rollout.prompt_scores``). Runs while no request is queued."""
        raise NotImplementedError(f"the {self.config.name} rollout does not score prompts")

    def check_weights(self) -> None:
        """Raise ``WeightSyncError`` while a failed sync has left the engine with mixed weights."""
        if not self._weights_valid:
            raise WeightSyncError(
                "the last weight sync failed part-way; the engine holds mixed weights until a sync succeeds"
            )

    # ------------------------------------------------------------------ weights and lifecycle
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named full tensors (the whole model) into the engine; returns the bytes loaded.

        Names are checked against the checkpoint's: an unknown name or a missing one raises
        ``WeightSyncError`` (a partial sync is never silent), and ``generate`` refuses to run
        until a later sync succeeds.
        """
        if self.skips_debug_sync():
            return 0
        stream = CheckedWeightStream(named_tensors, self.weight_names)
        self._weights_valid = False
        self._load_weights(stream)
        stream.finish()
        self._weights_valid = True
        return stream.bytes_seen

    def update_lora_adapter(self, adapter_config_json: str, named_tensors: NamedTensors) -> int:
        """Generate from now on with these LoRA adapters (peft names, ``adapter_config.json`` text) applied
        on the base weights; returns the bytes loaded."""
        raise ConfigError(f"config key 'rollout.lora_sync': the {self.config.name} rollout takes merged weights only; "
                          "set rollout.lora_sync=merged")

    def skips_debug_sync(self) -> bool:
        """TEST ONLY (``rollout.debug_skip_weight_sync_steps``): True for each of the first N syncs, which then load
        nothing, so the engine keeps older weights and the rollout is deliberately off-policy. A skipped sync
        still wakes a sleeping engine."""
        if self._syncs_to_skip <= 0:
            return False
        self._syncs_to_skip -= 1
        self.wake_up()
        return True

    @abstractmethod
    def _load_weights(self, named_tensors: NamedTensors) -> None:
        """Consume ``named_tensors`` into the engine and drop anything derived from the old weights.

        Copy from the tensors, never write into them: they may be the trainer's own parameters
        (colocated) or read-only views of the object store's buffers (split)."""

    def sleep(self) -> None:
        """Free engine memory between rollouts (colocated training); a no-op where unsupported."""

    def wake_up(self) -> None:
        """Undo ``sleep``; a no-op where unsupported."""

    def shutdown(self) -> None:
        """Release the engine; idempotent. Call it before the process exits."""

    def __enter__(self) -> "BaseRollout":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


ROLLOUT_REGISTRY: Registry[type[BaseRollout]] = Registry(
    "rollout backend", "rollout.name", error=ConfigError, base=BaseRollout
)


def rollout_names() -> list[str]:
    """Names of the registered rollout backends."""
    return ROLLOUT_REGISTRY.names()


def build_rollout(
    config: Any, model_path: str | Path, device: str | torch.device = "auto", replica_rank: int = 0
) -> BaseRollout:
    """The backend named by ``config.name``, built for ``model_path`` on ``device``."""
    return ROLLOUT_REGISTRY.get(config.name)(config, model_path, device, replica_rank)


def check_tensor_parallel_size(config: Any) -> None:
    """One ``ConfigError`` line when ``config.tensor_parallel_size`` > 1 and the backend ``config.name`` runs its
    engine in one process.

    Config loading calls it before Ray starts; each rollout calls it again as it is built (a rollout built by hand).
    """
    size = int(config.tensor_parallel_size)
    if size > 1 and not ROLLOUT_REGISTRY.get(config.name).runs_tensor_parallel:
        raise ConfigError(
            f"config key 'rollout.tensor_parallel_size': the {config.name} rollout runs its engine in one process, at "
            f"tensor parallel size 1; got {size}; use rollout=vllm, or more replicas (rollout.num_replicas)"
        )
