"""``megatron``: a megatron-core ``GPTModel`` with tensor, pipeline and data parallelism behind the engine contract.

The model is megatron's own GPT decoder (``architecture.py``: its config derived from the HF
``config.json`` of a Llama, Qwen2 or Qwen3 checkpoint), its weights converted from and to HF
names by ``weights.py``, tensor-parallel aware in both directions. The layout is
``tensor_model_parallel_size`` x ``pipeline_model_parallel_size`` x data parallel (the rest of the
world), megatron's process groups (``parallel.py``). Each rank builds its stage (``model.py``)
and runs it through megatron's schedules (``schedule.py``); gradients are reduced over the
data-parallel ranks by megatron's ``DistributedDataParallel`` and finalised by its
``finalize_model_grads`` (tied embeddings under pipeline parallelism included).

What rlflow keeps and megatron's training loop would otherwise own (``docs/engines.md``):

* the optimizer and LR schedule: rlflow's shared AdamW (no weight decay on 1-D parameters),
  stepping on DDP's grad buffers (``GradBufferAdamW``), its state replicated across the
  data-parallel ranks or, with ``use_distributed_optimizer``, sharded over them (rlflow's own sharding,
  ``optimizer_shares.py``, with fp32 masters under mixed precision), with the
  clip norm taken over the tensor- and pipeline-parallel groups (each weight counted once);
* checkpoints: DCP of each shard keyed by its place (``state.py``), through the shared checkpointer;
* micro-batching and sequence packing: rlflow's planner and token streams.

On CPU every megatron call runs inside ``cpu_compat.cpu_megatron()``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from megatron.core import parallel_state as mpu
from megatron.core import tensor_parallel
from megatron.core.distributed import DistributedDataParallel as MegatronDDP
from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
from megatron.core.transformer.transformer_config import TransformerConfig
from transformers import AutoConfig

from rlflow.config.ranges import AT_LEAST_1, Ranges
from rlflow.engines.base import Capability, EngineMesh, LossFn
from rlflow.engines.common.batching.packing import TokenStream, make_token_stream
from rlflow.engines.common.checkpoint.checkpointing import MODEL_OPTIM_DIR, EngineCheckpointer, save_model_files, setup_meta
from rlflow.engines.common.checkpoint.hf_export import save_hf_from_export
from rlflow.engines.common.delegating_engine import DelegatingEngine
from rlflow.engines.common.distributed import join_process_group
from rlflow.engines.common.forward.models import MODEL_KIND_REGISTRY
from rlflow.engines.common.optim.offload import HOST, HostOffload
from rlflow.engines.common.optim.optimizer_step import OptimizerStepper, clip_to_norm
from rlflow.engines.common.optim.optimizers import build_adamw, move_optimizer_state
from rlflow.engines.config import EngineConfig, EngineConfigError, StepHyperparams
from rlflow.engines.megatron.architecture import ModelLayout, transformer_config
from rlflow.engines.megatron.cpu_compat import cpu_megatron, cpu_rng_tracker
from rlflow.engines.megatron.model import (GradBufferAdamW, HostParking, StagePlan, build_stage, megatron_names,
                                          model_shape)
from rlflow.engines.megatron.parallel import join_model_parallel
from rlflow.engines.megatron.schedule import run_schedule
from rlflow.engines.megatron.optimizer_shares import OptimizerShares
from rlflow.engines.megatron.state import iter_whole_tensors, model_state, optimizer_state, whole_tensors_from_checkpoint
from rlflow.engines.megatron.weights import hf_from_whole, tensor_parallel_dim
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.models.hf_checkpoint import require_model_folder, resolve_dtype
from rlflow.protocol import DataProto
from rlflow.utils.device import resolve_device_type
from rlflow.utils.seed import set_seed

__all__ = ["MegatronEngine", "MegatronEngineConfig"]

_OUTPUT_LAYER = "output_layer.weight"


@dataclass
class MegatronEngineConfig(EngineConfig):
    """Options of the ``megatron`` engine (rlflow/configs/engine/megatron.yaml)."""

    name: str = "megatron"
    tensor_model_parallel_size: int = 1  # TP degree: attention heads, MLP and vocabulary split over this many ranks
    pipeline_model_parallel_size: int = 1  # PP degree: equal stages of layers; data parallel = world / (TP x PP)
    make_vocab_size_divisible_by: int = 128  # the vocabulary is padded to a multiple of this x TP (megatron's rule)
    logprob_chunk_size: int = 1024  # tokens per chunk when computing log-probs (bounds the fp32 logits shard)
    bias_activation_fusion: bool = True  # megatron's fused SwiGLU (torch.compile; needs a C++ compiler on CPU)
    use_distributed_optimizer: bool = False  # AdamW's state sharded over the data-parallel ranks (optimizer_shares.py)
    sequence_parallel: bool = False  # with TP: norms, residuals and dropout on a slice of the sequence per TP rank

    RANGES: ClassVar[Ranges] = {"tensor_model_parallel_size": AT_LEAST_1, "pipeline_model_parallel_size": AT_LEAST_1,
                                "make_vocab_size_divisible_by": AT_LEAST_1, "logprob_chunk_size": AT_LEAST_1}

    def combination_errors(self) -> list[str]:
        errors = super().combination_errors()
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            errors.append("sequence_parallel=true splits the sequence over the tensor-parallel ranks: it needs "
                          "tensor_model_parallel_size > 1")
        return errors


@ENGINE_REGISTRY.register("megatron")
class MegatronEngine(DelegatingEngine):
    """megatron-core ``GPTModel`` engine: tensor, pipeline and data parallelism, causal LMs and value models."""

    config_class = MegatronEngineConfig
    config: MegatronEngineConfig
    capabilities = frozenset({Capability.VALUE_MODEL, Capability.MIXED_PRECISION})

    def __init__(self, config: MegatronEngineConfig, model_path: str | Path, model_kind: str = "causal_lm") -> None:
        super().__init__(config, model_path, model_kind)
        self.kind = MODEL_KIND_REGISTRY.get(model_kind)
        self.plan, self.transformer_config = self._plan(config, self.model_path, model_kind)
        self.on_cpu = resolve_device_type(config.device) == "cpu"
        self.dtype = resolve_dtype(config.dtype)  # the weights AdamW steps (fp32 masters under mixed precision)
        self.compute_dtype = resolve_dtype(config.param_dtype)  # the model's parameters and activations
        self.module: Optional[MegatronDDP] = None

    @classmethod
    def node_local_ranks(cls, config: MegatronEngineConfig) -> int:
        return config.tensor_model_parallel_size  # megatron's TP ranks are adjacent

    @classmethod
    def check_model(cls, config: EngineConfig, model_path: str | Path, model_kind: str, world_size: int) -> None:
        plan, _ = cls._plan(config, Path(model_path), model_kind)
        stages = plan.layout.tensor_parallel * plan.layout.pipeline_parallel
        if world_size % stages:
            raise EngineConfigError(
                f"tensor_model_parallel_size={plan.layout.tensor_parallel} x pipeline_model_parallel_size="
                f"{plan.layout.pipeline_parallel} must divide the {world_size} worker processes"
            )

    @staticmethod
    def _plan(config: MegatronEngineConfig, model_path: Path, model_kind: str) -> tuple[StagePlan, TransformerConfig]:
        """The stage plan and megatron config for the model folder; one-line ``EngineConfigError`` for what cannot run."""
        folder = require_model_folder(model_path)
        hf = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=config.trust_remote_code)
        layout = ModelLayout(config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
                             config.make_vocab_size_divisible_by)
        value_model = model_kind == "value"
        plan = StagePlan(hf, layout, value_model, tied=bool(hf.tie_word_embeddings) and not value_model,
                         logprob_chunk_size=config.logprob_chunk_size)
        megatron_config = transformer_config(hf, layout, resolve_dtype(config.param_dtype), config.gradient_checkpointing,
                                             config.bias_activation_fusion, config.sequence_parallel)
        on_cpu = resolve_device_type(config.device) == "cpu"
        if on_cpu and layout.tensor_parallel > 1 and megatron_config.attention_dropout > 0:
            raise EngineConfigError(
                f"attention_dropout={megatron_config.attention_dropout} under tensor parallelism needs megatron's "
                "CUDA RNG tracker; on CPU use tensor_model_parallel_size=1 or a checkpoint without dropout"
            )
        return plan, megatron_config

    def _megatron(self) -> AbstractContextManager[None]:
        return cpu_megatron() if self.on_cpu else nullcontext()

    def initialize(self) -> None:
        cfg = self.config
        self.device, self.rank, self.world_size = join_process_group(cfg.device)
        set_seed(cfg.seed)  # identical on every rank: a fresh value head agrees
        hf_model = self.kind.load(self.model_path, dtype=cfg.dtype, attn_implementation="sdpa",
                                  trust_remote_code=cfg.trust_remote_code)
        with self._megatron():
            self.ranks = join_model_parallel(self, self.plan.layout.tensor_parallel, self.plan.layout.pipeline_parallel)
            if self.on_cpu:
                cpu_rng_tracker()
            else:
                tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)
            # built in dtype, so that mixed precision's masters start from the checkpoint's weights, then cast
            building = replace(self.transformer_config, params_dtype=self.dtype, pipeline_dtype=self.dtype)
            stage = build_stage(self.plan, building, hf_model, self.ranks, self.dtype)
            del hf_model
            stage.to(self.device)
            named = megatron_names(stage)
            shares = self._optimizer_shares(named)
            for param in stage.parameters():  # the parameters alone: buffers (rotary frequencies) keep theirs
                param.data = param.data.to(self.compute_dtype)
            ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False)
            self.module = MegatronDDP(self.transformer_config, ddp_config, stage)
        set_seed(cfg.seed + self.rank)
        self.stage = stage
        self.shares = shares
        # what AdamW steps: the parameters, or this rank's shares of them (no decay: 1-D parameters')
        self.stepped = named if shares is None else shares.named()
        no_decay = {n for n, p in named if p.ndim < 2} if shares is None else \
            {shard.name for shard in shares.shares if shard.whole.ndim < 2}
        self.optimizer = GradBufferAdamW(build_adamw(self.stepped, no_decay, cfg.optimizer), self.module, shares)
        # the clip norm counts each weight once: shards on every TP rank, replicated weights on TP rank 0,
        # and never the last stage's copy of tied embeddings
        self.norm_params = [
            param for name, param in named
            if param.requires_grad and not (self.plan.tied and name == _OUTPUT_LAYER)
            and (tensor_parallel_dim(name) is not None or self.ranks.tp_rank == 0)
        ]
        self.stepper = OptimizerStepper(self.optimizer, cfg, self._clip_grad_norm)
        grad_buffers = [buffer.grad_data for buffer in self.module.buffers + self.module.expert_parallel_buffers]
        self.parking = HostParking(list(stage.parameters()) + grad_buffers)
        self.offloader = HostOffload(self.device, cfg, self._move_params,
                                     partial(move_optimizer_state, self.optimizer.optimizer))
        layout = {"tensor_model_parallel_size": self.plan.layout.tensor_parallel,
                  "pipeline_model_parallel_size": self.plan.layout.pipeline_parallel}
        self.checkpointer = EngineCheckpointer(setup_meta(cfg.name, self.model_kind, self.world_size, layout),
                                               self.stepper, self.rank, None, seed=cfg.seed)

    def _optimizer_shares(self, named: list[tuple[str, torch.nn.Parameter]]) -> Optional[OptimizerShares]:
        """What AdamW steps instead of the parameters: shares over data parallelism (the distributed optimizer),
        fp32 masters (mixed precision), both, or nothing (None: the parameters themselves)."""
        sharded = self.config.use_distributed_optimizer and self.ranks.dp_size > 1
        mixed = self.compute_dtype != self.dtype
        if not (sharded or mixed):
            return None
        return OptimizerShares(named, self.ranks, sharded, self.dtype if mixed else None)

    @property
    def mesh(self) -> EngineMesh:
        """Data-parallel coordinates from megatron's groups; TP rank 0 of the last pipeline stage collects."""
        self._require_initialized()
        return EngineMesh(dp_rank=self.ranks.dp_rank, dp_size=self.ranks.dp_size, is_collect=self.ranks.is_collect)

    # ------------------------------------------------------------------ compute
    def forward_backward(
        self, batch: DataProto, loss_fn: Optional[LossFn] = None, forward_only: bool = False
    ) -> tuple[DataProto, dict[str, Any]]:
        self._require_initialized()
        with self.offloader.params_resident(), self._megatron():
            return run_schedule(batch, self.module, loss_fn, forward_only, self.config, self.ranks, self.device,
                                self._token_stream)

    def _token_stream(self, micro: DataProto) -> TokenStream:
        stream = make_token_stream(
            micro.batch["input_ids"], micro.batch["attention_mask"], micro.batch.get("position_ids"),
            remove_padding=self.config.use_remove_padding, hidden_size=self.plan.hf.hidden_size,
            target_ids=micro.batch.get("target_ids"),
        )
        return stream.widened(self.plan.layout.tensor_parallel) if self.config.sequence_parallel else stream

    def optim_step(self, lr: Optional[float] = None, hyperparams: Optional[StepHyperparams] = None) -> dict[str, Any]:
        self._require_initialized()
        with self.offloader.resident(), self._megatron():
            finalize_model_grads([self.module])  # data-parallel mean (already taken: unchanged) + tied embeddings
            self.optimizer.attach_grads()
            return self.stepper.step(lr, hyperparams)

    def _clip_grad_norm(self, max_norm: float) -> float:
        """The global gradient norm (``norm_params``), reduced over the tensor- and pipeline-parallel ranks;
        clipped as ``torch.nn.utils.clip_grad_norm_`` clips."""
        counted = [param.grad for param in self.norm_params if param.grad is not None]
        square = sum((torch.linalg.vector_norm(grad, dtype=torch.float32) ** 2 for grad in counted),
                     torch.zeros((), device=self.device))
        dist.all_reduce(square, group=mpu.get_model_parallel_group())
        norm = float(square.sqrt())
        clip_to_norm([param.grad for param in self.optimizer.params if param.grad is not None], norm, max_norm)
        return norm

    # ------------------------------------------------------------------ placement
    def _move_params(self, device: torch.device) -> None:
        """Parameters and megatron DDP's gradient buffers, parked in host memory rather than moved with
        ``.to()``, which would unhook megatron's gradient accumulation (``HostParking``)."""
        if self.on_cpu:  # host and device are the same memory
            return
        if device == HOST:
            self.parking.park()
        else:
            self.parking.restore()

    # ------------------------------------------------------------------ checkpoints and export
    def _state(self) -> dict[str, Any]:
        named = megatron_names(self.stage)
        state = {"model": model_state(named, self.ranks),
                 "optim": optimizer_state(self.optimizer.optimizer, self.stepped, self.ranks)}
        masters = self.shares.named_masters() if self.shares is not None else {}
        return {**state, "masters": masters} if masters else state

    def save_checkpoint(self, path: str | Path) -> None:
        self._require_initialized()
        with self.offloader.resident(), self.checkpointer.save(path) as folder:
            dcp.save(self._state(), checkpoint_id=str(folder / MODEL_OPTIM_DIR))
            save_model_files(folder, self.model_path, None)

    def load_checkpoint(self, path: str | Path) -> None:
        self._require_initialized()
        with self.checkpointer.load(path) as folder, self.offloader.resident():
            dcp.load(self._state(), checkpoint_id=str(folder / MODEL_OPTIM_DIR))

    def export_hf_weights(self, dtype: Optional[torch.dtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
        self._require_initialized()
        shape = model_shape(self.plan.hf, self.plan.layout)
        offsets = [self.plan.layer_offset(stage) for stage in range(self.plan.layout.pipeline_parallel)]
        skip = frozenset({_OUTPUT_LAYER} if self.plan.tied else ())  # HF writes tied embeddings once
        named = megatron_names(self.stage)
        if self.shares is not None and self.shares.masters:  # mixed precision: the fp32 weights, not their bf16 copy
            masters = self.shares.whole_masters()
            named = [(name, masters.get(id(param), param)) for name, param in named]
        with self.offloader.params_resident():
            for name, whole in iter_whole_tensors(named, self.ranks, offsets, skip, self.device):
                for hf_name, tensor in hf_from_whole(name, whole, shape):
                    yield hf_name, tensor if dtype is None else tensor.to(dtype)

    def save_hf(self, path: str | Path) -> None:
        self._require_initialized()
        export_config = self.kind.folder_export_config
        config = export_config(self.model_path) if export_config is not None else None
        save_hf_from_export(path, self.export_hf_weights(), self.model_path, config)

    @classmethod
    def checkpoint_hf_tensors(
        cls, state: Iterable[tuple[str, torch.Tensor]], model_files: Path
    ) -> Iterator[tuple[str, torch.Tensor]]:
        hf = AutoConfig.from_pretrained(model_files, local_files_only=True)
        entries = list(state)
        value_model = any(".value_head." in key for key, _ in entries)
        tied = bool(hf.tie_word_embeddings) and not value_model
        shape = model_shape(hf, ModelLayout(1, 1, 1))  # the export trims the padded vocabulary to the HF one
        def layer_offset(stage: int, stages: int) -> int:
            return ModelLayout(1, stages, 1).layer_offset(stage, hf.num_hidden_layers)

        for name, whole in whole_tensors_from_checkpoint(entries, layer_offset):
            if not (tied and name == _OUTPUT_LAYER):
                yield from hf_from_whole(name, whole, shape)
