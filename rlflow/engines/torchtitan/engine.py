"""``torchtitan``: torchtitan's own decoder models and parallelize functions behind the engine contract.

The model is torchtitan's class for the checkpoint's family (``architectures.py``: qwen2, qwen3,
llama), its config derived from the HF ``config.json`` and its weights converted by the family's
state-dict adapter (``from_hf`` in, ``to_hf`` out, tied embeddings written once as HF does).
Parallelism is the family's own ``parallelize_<family>``: torchtitan's tensor-parallel plan
(``tensor_parallel_size``) and FSDP2 wrapping over a ``ParallelDims`` mesh built from rlflow's
config, full activation checkpointing (``gradient_checkpointing``) and ``torch.compile``
(``compile``) as switches. Pipeline parallelism (``pipeline_parallel_size``) is torchtitan's split of the
decoder into stages run by torch's pipeline schedules (``pipeline.py``).

What rlflow keeps and torchtitan's trainer would otherwise own (``docs/engines.md``):

* the process group: the rlflow worker's (``join_process_group``); torchtitan's
  ``init_distributed`` is never called, so its comm settings do not exist here;
* data, tokenizer, metrics: rlflow's; torchtitan's dataloader, tokenizer and loggers are never built;
* the optimizer and LR schedule: rlflow's shared AdamW (no weight decay on 1-D parameters)
  and warmup-from-``step + 1`` schedule, with the per-step LR override;
* gradient averaging: rlflow's loss is a mean over the data-parallel ranks' tokens and FSDP
  averages across them, so torchtitan's ``disable_fsdp_gradient_division`` (it divides by the
  global token count itself) is undone after its parallelize;
* checkpoints: DCP through the shared checkpointer (model, optimizer, schedule, RNG).
"""

from __future__ import annotations

import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, ClassVar, Iterable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed import ParallelDims
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.distributed.pipeline_parallel import _split_module
from torchtitan.models.common.attention import FlexAttention
from torchtitan.models.common.decoder import Decoder
from torchtitan.protocols.state_dict_adapter import StateDictAdapter
from transformers import AutoConfig

from rlflow.config.ranges import AT_LEAST_1, Ranges
from rlflow.engines.base import Capability, EngineMesh, LossFn
from rlflow.engines.common.batching.packing import document_causal_mask
from rlflow.engines.common.forward.hf_module import micro_batch_stream
from rlflow.engines.common.forward.models import FORWARD_PREFIX, ForwardModule
from rlflow.engines.common.fsdp.fully_shard import FullyShardEngine, clip_grad_norm
from rlflow.engines.common.optim.optimizers import clean_param_name
from rlflow.engines.config import EngineConfig, EngineConfigError
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.engines.torchtitan.architectures import AttentionConfig, TitanArchitecture, titan_architecture
from rlflow.engines.torchtitan.cpu_compat import CPU_STREAM_ATTENTION, DenseMaskAttention, cpu_device_type
from rlflow.engines.torchtitan.forward import TitanCausalLMForward, TitanPipelineStageForward
from rlflow.engines.torchtitan.pipeline import (
    PIPELINE_SCHEDULES,
    PipelineRanks,
    layer_count_error,
    pipeline_tensors,
    run_pipeline,
    stage_module_names,
)
from rlflow.models.hf_checkpoint import load_causal_lm, require_model_folder, resolve_dtype
from rlflow.protocol import DataProto
from rlflow.utils.device import resolve_device_type
from rlflow.utils.seed import set_seed

__all__ = ["TorchtitanEngine", "TorchtitanEngineConfig"]

_TITAN_PARAM_DTYPES = ("float32", "bfloat16")  # TrainingConfig.mixed_precision_param
_RESHARD_POLICIES = ("default", "always", "never")  # ParallelismConfig.fsdp_reshard_after_forward


@dataclass
class TorchtitanEngineConfig(EngineConfig):
    """Options of the ``torchtitan`` engine (rlflow/configs/engine/torchtitan.yaml)."""

    name: str = "torchtitan"
    tensor_parallel_size: int = 1  # TP degree (torchtitan's sharding plan); data-parallel size = world / this
    logprob_chunk_size: int = 1024  # tokens per chunk when turning hidden states into log-probs
    fsdp_reshard_after_forward: str = "default"  # torchtitan's policy: default | always | never
    defer_grad_reduce: bool = True  # reduce-scatter gradients once per mini-batch, not per micro-batch
    compile: bool = False  # torch.compile each transformer block (GPU-first; see docs/engines.md)
    pipeline_parallel_size: int = 1  # pipeline stages (torch's schedules); data-parallel size = world / (TP x this)
    pipeline_parallel_schedule: str = "1F1B"  # 1F1B | GPipe

    RANGES: ClassVar[Ranges] = {"tensor_parallel_size": AT_LEAST_1, "logprob_chunk_size": AT_LEAST_1,
                                "pipeline_parallel_size": AT_LEAST_1}

    def range_checks(self) -> dict[str, bool]:
        return {
            **super().range_checks(),
            "param_dtype": self.param_dtype in _TITAN_PARAM_DTYPES,
            "reduce_dtype": self.reduce_dtype == "float32",
            "fsdp_reshard_after_forward": self.fsdp_reshard_after_forward in _RESHARD_POLICIES,
            "pipeline_parallel_schedule": self.pipeline_parallel_schedule in PIPELINE_SCHEDULES,
        }

    def combination_errors(self) -> list[str]:
        errors = super().combination_errors()
        if self.tensor_parallel_size > 1 and self.pipeline_parallel_size > 1:
            errors.append(f"tensor_parallel_size={self.tensor_parallel_size} with pipeline_parallel_size="
                          f"{self.pipeline_parallel_size}: the torchtitan engine runs one of the two at a time")
        return errors


@ENGINE_REGISTRY.register("torchtitan")
class TorchtitanEngine(FullyShardEngine):
    """torchtitan model + FSDP2 (its ``parallelize_<family>``) engine for causal LMs."""

    config_class = TorchtitanEngineConfig
    config: TorchtitanEngineConfig
    capabilities = frozenset({Capability.MIXED_PRECISION, Capability.RESHARD})

    def __init__(self, config: TorchtitanEngineConfig, model_path: str | Path, model_kind: str = "causal_lm") -> None:
        super().__init__(config, model_path, model_kind)  # refuses value models (no Capability.VALUE_MODEL)
        self.folder = require_model_folder(self.model_path)
        # on CPU the inner attention is the dense-mask fallback (cpu_compat); everywhere else torchtitan's flex
        self.on_cpu = resolve_device_type(config.device) == "cpu"
        attention = DenseMaskAttention.Config if self.on_cpu else FlexAttention.Config
        self.architecture, self.model_config = _titan_model(self.folder, config.trust_remote_code, attention)
        problem = _layout_error(config, self.model_config)
        if problem:
            raise EngineConfigError(problem)
        self.parallelism = ParallelismConfig(
            tensor_parallel_degree=config.tensor_parallel_size,
            enable_sequence_parallel=False,  # packed rows of any width: no sequence sharding between layers
            fsdp_reshard_after_forward=config.fsdp_reshard_after_forward,
            spmd_backend="partial_dtensor",
        )
        try:  # the sharding plan goes into the model config, before the model is built
            self.model_config.update_from_config(config=SimpleNamespace(parallelism=self.parallelism))
        except ValueError as error:  # e.g. a TP degree that does not divide the heads
            raise EngineConfigError(f"torchtitan engine: {str(error).splitlines()[0]}") from None

    @classmethod
    def node_local_ranks(cls, config: TorchtitanEngineConfig) -> int:
        return config.tensor_parallel_size  # torchtitan's mesh puts TP innermost: adjacent ranks

    @classmethod
    def check_model(cls, config: TorchtitanEngineConfig, model_path: str | Path, model_kind: str,
                    world_size: int) -> None:
        _, model_config = _titan_model(require_model_folder(Path(model_path)), config.trust_remote_code,
                                       FlexAttention.Config)
        problem = _layout_error(config, model_config, world_size)
        if problem:
            raise EngineConfigError(problem)

    @classmethod
    def checkpoint_hf_tensors(
        cls, state: Iterable[tuple[str, torch.Tensor]], model_files: Path
    ) -> Iterator[tuple[str, torch.Tensor]]:
        architecture, model_config = _titan_model(model_files, trust_remote_code=False, attention=FlexAttention.Config)
        return _to_hf(architecture.adapter(model_config, None), state, None)

    # ------------------------------------------------------------------ model hooks
    def _load_forward_module(self) -> ForwardModule:
        cfg = self.config
        set_seed(cfg.seed)
        with torch.device("meta"):
            model = self.model_config.build()
        model.to_empty(device=self.device)
        model.to(dtype=resolve_dtype(cfg.dtype))
        model.init_states(buffer_device=self.device)  # RoPE caches computed here, in float32
        self.adapter = self.architecture.adapter(self.model_config, None)
        hf_model = load_causal_lm(self.folder, dtype=cfg.dtype, trust_remote_code=cfg.trust_remote_code)
        model.load_state_dict(self.adapter.from_hf(hf_model.state_dict()), strict=True)
        # transformers' embedding leaves the padding token's row out of training (nn.Embedding padding_idx);
        # torchtitan's Embedding is an nn.Embedding that follows the same rule once told the index
        model.tok_embeddings.padding_idx = hf_model.get_input_embeddings().padding_idx
        del hf_model
        set_seed(cfg.seed + self.rank)
        forward_class = TitanPipelineStageForward if cfg.pipeline_parallel_size > 1 else TitanCausalLMForward
        if self.on_cpu:
            return forward_class(model, cfg.logprob_chunk_size, CPU_STREAM_ATTENTION, document_causal_mask)
        # one packed row: flex attention's block mask skips the blocks it masks
        return forward_class(model, cfg.logprob_chunk_size, "flex_attention")

    def _hf_named_tensors(
        self, named_full_tensors: Iterator[tuple[str, torch.Tensor]], dtype: Optional[torch.dtype]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        return _to_hf(self.adapter, named_full_tensors, dtype)

    # ------------------------------------------------------------------ sharding hooks
    def _parallelize(self, module: ForwardModule) -> nn.Module:
        cfg = self.config
        tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
        problem = _layout_error(cfg, self.model_config, self.world_size)
        if problem:
            raise EngineConfigError(problem)
        self.parallel_dims = ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=tp, pp=pp, ep=1,
                                          world_size=self.world_size, spmd_backend="partial_dtensor")
        with cpu_device_type() if self.on_cpu else nullcontext():
            self.parallel_dims.build_mesh()
        dp_mesh = self.parallel_dims.get_mesh("fsdp")
        self.dp_group = dp_mesh.get_group()
        self.pipeline: Optional[PipelineRanks] = None
        if pp > 1:  # this rank keeps its stage's modules only (torchtitan's split)
            pp_group = self.parallel_dims.get_mesh("pp").get_group()
            self.pipeline = PipelineRanks(self.parallel_dims.get_mesh("pp").get_local_rank(), pp_group,
                                          tuple(dist.get_process_group_ranks(pp_group)), self.dp_group)
            names = stage_module_names(len(self.model_config.layers), pp)[self.pipeline.stage]
            module.model = _split_module(module.model, names)
        training = TrainingConfig(mixed_precision_param=cfg.param_dtype, mixed_precision_reduce=cfg.reduce_dtype)
        with tempfile.TemporaryDirectory(prefix="rlflow-titan-") as dump_folder:  # torchtitan's debug dumps only
            self.architecture.parallelize(
                module.model,
                parallel_dims=self.parallel_dims,
                training=training,
                parallelism=self.parallelism,
                compile_config=CompileConfig(enable=cfg.compile),
                ac_config=FullAC.Config() if cfg.gradient_checkpointing else None,
                dump_folder=dump_folder,
            )
        # The forward module becomes the FSDP root (no parameters of its own): the chunked LM head runs after the
        # decoder's forward returns, and FSDP2 completes its units' forward state only at the end of the root's.
        mp_policy = MixedPrecisionPolicy(param_dtype=resolve_dtype(cfg.param_dtype), reduce_dtype=resolve_dtype(cfg.reduce_dtype))
        fully_shard(module, mesh=dp_mesh, mp_policy=mp_policy)
        for unit in module.modules():
            if isinstance(unit, FSDPModule):
                unit.set_gradient_divide_factor(None)  # FSDP's default again: the mean over the data-parallel ranks
        return module

    def _layout(self) -> dict[str, Any]:  # dp_shard = world size / (TP x PP); PP only when used (older checkpoints)
        layout = {"tensor_parallel_size": self.config.tensor_parallel_size}
        if self.config.pipeline_parallel_size > 1:
            layout["pipeline_parallel_size"] = self.config.pipeline_parallel_size
        return layout

    # ------------------------------------------------------------------ pipeline parallelism (pipeline.py)
    def forward_backward(
        self, batch: DataProto, loss_fn: Optional[LossFn] = None, forward_only: bool = False
    ) -> tuple[DataProto, dict[str, Any]]:
        self._require_initialized()
        if self.pipeline is None:
            return super().forward_backward(batch, loss_fn, forward_only)
        layout = partial(micro_batch_stream, config=self.config, attn_implementation=self.attn_implementation,
                         hidden_size=self.hidden_size)
        with self.offloader.params_resident():
            return run_pipeline(batch, self.module, loss_fn, forward_only, self.config, self.pipeline, self.device,
                                layout, self.config.pipeline_parallel_schedule)

    def _iter_full_tensors(self, only: Optional[Callable[[str], bool]] = None) -> Iterator[tuple[str, torch.Tensor]]:
        local = super()._iter_full_tensors(only)
        if self.pipeline is None:
            return local
        names = [(name, tuple(param.shape), param.dtype) for name, param in self.module.named_parameters()
                 if only is None or only(name)]
        return pipeline_tensors(local, names, self.pipeline, self.device)

    def _clip_grad_norm(self, max_norm: float) -> float:
        return clip_grad_norm(self.module.parameters(), max_norm, self.pipeline.norm if self.pipeline else None)

    def _ranks_hold_different_parameters(self) -> bool:
        return self.pipeline is not None

    @property
    def mesh(self) -> EngineMesh:
        """Data-parallel coordinates from the ``fsdp`` mesh; TP rank 0 of each group collects."""
        self._require_initialized()
        dp_mesh = self.parallel_dims.get_mesh("fsdp")
        tp_rank = self.parallel_dims.get_mesh("tp").get_local_rank() if self.parallel_dims.tp_enabled else 0
        last_stage = self.pipeline is None or self.pipeline.is_last
        return EngineMesh(dp_rank=dp_mesh.get_local_rank(), dp_size=dp_mesh.size(),
                          is_collect=tp_rank == 0 and last_stage)


def _layout_error(config: TorchtitanEngineConfig, model_config: Decoder.Config,
                  world_size: Optional[int] = None) -> Optional[str]:
    """Why the model (and ``world_size`` ranks, when given) cannot take the config's tensor/pipeline layout, or None."""
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(config, key) > 1 and model_config.enable_weight_tying:
            return (f"{key}={getattr(config, key)} splits the tied input and output embeddings into two parameters "
                    f"(they would train apart); use {key}=1 for a checkpoint with tie_word_embeddings=true")
    if world_size is not None and world_size % (config.tensor_parallel_size * config.pipeline_parallel_size):
        return (f"tensor_parallel_size={config.tensor_parallel_size} x pipeline_parallel_size="
                f"{config.pipeline_parallel_size} must divide the {world_size} ranks")
    return layer_count_error(len(model_config.layers), config.pipeline_parallel_size)


def _titan_model(
    folder: Path, trust_remote_code: bool, attention: AttentionConfig
) -> tuple[type[TitanArchitecture], Decoder.Config]:
    """The torchtitan family and model config of the HF folder (one-line error for what it cannot build)."""
    hf_config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    architecture = titan_architecture(hf_config)
    return architecture, architecture.model_config(hf_config, attention)


def _to_hf(
    adapter: StateDictAdapter, named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: Optional[torch.dtype]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, tensor)`` from the forward module's ``model.<titan name>`` tensors, one at a time (``to_hf``
    leaves out a tied ``lm_head.weight``: HF writes tied embeddings once)."""
    for name, tensor in named_tensors:
        titan_name = clean_param_name(name).removeprefix(FORWARD_PREFIX)
        for hf_name, hf_tensor in adapter.to_hf({titan_name: tensor}).items():
            yield hf_name, hf_tensor if dtype is None else hf_tensor.to(dtype)
