"""``RolloutWorker``: one rollout replica per process, driven by the controller through a worker group.

Every process of the group is a replica of its own (tensor parallel size 1) and a DP rank of the
``rollout`` mesh. ``generate_sequences`` spreads prompts over the replicas balanced by prompt
token count (``DP_BALANCED_TOKENS``) and returns the samples in input order. In a split
placement the trainer publishes its weights to the Ray object store (``publish_weights``) and
``update_weights`` streams them into every replica, after the calls sent before it. With partial rollouts
(``fully_async``) ``update_weights_live`` does so on the worker's second thread, parking the generation
in progress (``LiveWeights``), and a generation call names the oldest weights it may use (``POLICY_VERSION``).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Optional

from rlflow.engines import BaseEngine
from rlflow.meta_info import METRICS, POLICY_VERSION, PROMPT_TOP_K, SAMPLING, VALIDATE
from rlflow.models.hf_checkpoint import resolve_dtype
from rlflow.protocol import DataProto
from rlflow.rollout import BaseRollout, build_rollout, stream_published_weights, syncs_adapters
from rlflow.rollout.agent import generate_trajectories
from rlflow.rollout.balance import DP_BALANCED_TOKENS
from rlflow.rollout.live_weights import LiveWeights
from rlflow.rollout.processing import prompt_token_lists
from rlflow.rollout.prompt_scores import scores_batch
from rlflow.rollout.request_server import RequestServer
from rlflow.rollout.weight_sync import MiB
from rlflow.workers import ONE_TO_ALL, Worker, register

ROLLOUT_MESH = "rollout"


def sync_engine_into_rollout(engine: BaseEngine, rollout: BaseRollout, rollout_config: Any) -> dict[str, float]:
    """Copy a training engine's current weights, in the rollout's dtype, into a rollout engine of the same
    process (a collective export: every rank's export yields the complete model); with
    ``rollout.lora_sync=adapter``, the engine's LoRA adapters alone. Returns the sync's timing and size."""
    start = time.perf_counter()
    dtype = resolve_dtype(rollout_config.dtype)
    if syncs_adapters(rollout_config):
        loaded = rollout.update_lora_adapter(engine.lora_adapter_config(), engine.export_lora_adapter(dtype))
    else:
        loaded = rollout.update_weights(engine.export_hf_weights(dtype=dtype))
    return {"timing_s/weight_sync": time.perf_counter() - start, "weight_sync/mb": loaded / MiB}


class RolloutMethods:
    """The controller-facing rollout methods, for any worker that sets ``self.rollout`` (a
    ``BaseRollout``) and ``self.config`` (its ``RolloutConfig``) and registers the ``rollout`` mesh.

    ``VALIDATE`` in ``prompts.meta_info`` (``rlflow.meta_info``) selects ``config.val_kwargs`` sampling
    instead of the training keys, and ``SAMPLING`` (a dict of ``SamplingConfig`` keys, plus
    ``stop_token_ids``) sets this request's own; ``GLOBAL_STEP`` enters the sampling seeds. With
    ``rollout.multi_turn.enable`` each row runs its agent loop (``rlflow.rollout.agent``). With
    ``POLICY_VERSION`` the call waits for weights at least that new, runs on the request level (agent loops,
    ``single_turn`` by default) with partial outputs kept, and reports ``rollout_versions``.
    """

    rollout: Any
    config: Any
    live: Optional[LiveWeights] = None  # a split replica's weights version (partial rollouts)

    @register(
        dispatch_mode=DP_BALANCED_TOKENS,
        mesh=ROLLOUT_MESH,
        reduce={"timing_s/generate": "max", "rollout/generated_tokens": "sum"},
    )
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate this replica's share; per-replica timing goes to ``meta_info`` ``METRICS``."""
        meta = prompts.meta_info
        sampling = SAMPLING.read(meta) if SAMPLING.name in meta else (self.config.val_kwargs if VALIDATE.read(meta) else None)
        start = time.perf_counter()
        agent_metrics: dict[str, float] = {}
        min_version = POLICY_VERSION.read(meta)
        if min_version is not None:
            output, agent_metrics = self._generate_live(prompts, sampling, int(min_version))
        else:
            with self._engine_to_itself():
                if self.config.multi_turn.enable:
                    output, agent_metrics = generate_trajectories(self.rollout, prompts, self.config.multi_turn, sampling)
                else:
                    output = self.rollout.generate(prompts, sampling)
        output.meta_info[METRICS.name] = {
            "timing_s/generate": time.perf_counter() - start,
            "rollout/generated_tokens": float(output.batch["response_mask"].sum()),
            **agent_metrics,
        }
        return output

    @register(dispatch_mode=DP_BALANCED_TOKENS, mesh=ROLLOUT_MESH)
    def score_prompts(self, prompts: DataProto) -> DataProto:
        """This replica's share of the (left-padded) ``prompts`` scored by its weights, ``PROMPT_TOP_K`` best tokens a
        position: the ``rlflow.rollout.prompt_scores`` columns, aligned with ``input_ids``."""
        top_k = PROMPT_TOP_K.read(prompts.meta_info)
        with self._engine_to_itself():
            scores = self.rollout.score_prompts([tuple(tokens) for tokens in prompt_token_lists(prompts)], top_k)
        return scores_batch(prompts.batch["attention_mask"], scores, top_k)

    def _engine_to_itself(self) -> AbstractContextManager[None]:
        """Keep a live weight sync (``update_weights_live``) out while this thread uses the engine."""
        return nullcontext() if self.live is None else self.live.exclusive()

    def _generate_live(self, prompts: DataProto, sampling: Any, min_version: int) -> tuple[DataProto, dict[str, float]]:
        if self.live is None:
            raise RuntimeError("partial rollouts need a rollout worker of its own (trainer.placement=split)")
        self.rollout.track_partial_outputs(True)
        server = RequestServer(self.rollout)
        with self.live.serving(server, min_version, timeout_s=None):
            return generate_trajectories(self.rollout, prompts, self.config.multi_turn, sampling, server=server)

    @register(dispatch_mode=ONE_TO_ALL)
    def sleep(self) -> None:
        """Free engine memory until the next ``wake_up`` (GPU; a no-op on CPU)."""
        self.rollout.sleep()

    @register(dispatch_mode=ONE_TO_ALL)
    def wake_up(self) -> None:
        """Restore engine memory after ``sleep``."""
        self.rollout.wake_up()

    def close(self) -> None:
        """Shut the engine down before the process exits (frees its shared memory)."""
        self.rollout.shutdown()


class RolloutWorker(RolloutMethods, Worker):
    """Hosts one ``BaseRollout`` replica (backend from ``config.name``) for the model at ``model_path``."""

    def __init__(self, config: Any, model_path: str | Path):
        super().__init__()
        self.config = config
        self.register_mesh(ROLLOUT_MESH, dp_rank=self.rank, dp_size=self.world_size, is_collect=True)
        self.rollout = build_rollout(config, model_path, self.device, replica_rank=self.rank)
        self.live = LiveWeights()

    @register(dispatch_mode=ONE_TO_ALL)
    def update_weights(self, weight_refs: list, version: int) -> dict[str, float]:
        """Load weights published with ``rlflow.rollout.publish_weights`` (a list of bucket ObjectRefs), as policy
        ``version``."""
        start = time.perf_counter()
        loaded = self.live.change(version, lambda: self.rollout.update_weights(stream_published_weights(weight_refs)))
        return {"timing_s/weight_sync": time.perf_counter() - start, "weight_sync/mb": loaded / MiB}

    @register(dispatch_mode=ONE_TO_ALL, concurrent=True)
    def update_weights_live(self, weight_refs: list, version: int) -> dict[str, float]:
        """``update_weights`` beside a generation in progress (partial rollouts): the generation is parked between
        two engine steps, its requests aborted, the weights load as policy ``version``, and the requests resume
        from their sampled tokens with them."""
        start = time.perf_counter()
        loaded = self.live.change(version, lambda: self.rollout.update_weights(stream_published_weights(weight_refs)))
        return {"timing_s/weight_sync": time.perf_counter() - start, "weight_sync/mb": loaded / MiB}

    @register(dispatch_mode=ONE_TO_ALL)
    def update_lora_adapter(self, published: dict[str, Any]) -> dict[str, float]:
        """Load LoRA adapters published with ``Actor.publish_lora_adapter`` (``rollout.lora_sync=adapter``)."""
        start = time.perf_counter()
        loaded = self.rollout.update_lora_adapter(published["config"], stream_published_weights(published["refs"]))
        return {"timing_s/weight_sync": time.perf_counter() - start, "weight_sync/mb": loaded / MiB}
