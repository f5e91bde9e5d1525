"""The engine contract: what every training/inference engine offers the roles.

An engine knows a model, its parallelism and its optimizer, and nothing about RL.
Roles (actor, critic, reference, reward model) are written once against
``BaseEngine``; the caller owns the loop (Tinker-style): it calls
``forward_backward`` once per mini-batch and ``optim_step`` once per optimizer step.

Batch layout (``DataProto.batch``), all ``[B, T]`` and aligned on tokens:

* ``input_ids`` (long), ``attention_mask`` (1 = real token; left and/or right padding);
* ``position_ids`` (optional; default ``cumsum(attention_mask) - 1``);
* ``loss_mask`` (needed whenever a ``loss_fn`` is given): which tokens the loss covers;
* ``target_ids`` (optional, long): the token whose log-prob column ``t`` reports instead of ``input_ids[b, t]``
  (Tinker's per-position targets; a row may be scored for tokens it does not contain).

``meta_info`` may carry ``temperature`` (default 1.0) and ``compute_entropy`` (default False): ``TEMPERATURE``
and ``COMPUTE_ENTROPY`` of ``rlflow.meta_info``.

Per-token outputs, ``[B, T]`` in the input order, zero where undefined:

* ``log_probs[b, t]`` = log p(input_ids[b, t] | input_ids[b, :t]) / temperature-scaled logits (``target_ids[b, t]``
  in place of ``input_ids[b, t]`` where given)
  (the log-prob *of* token t, so it lines up with ``loss_mask``; 0 at each sequence's first token);
* ``entropy[b, t]`` = entropy of the distribution that token t was drawn from (only when requested);
* ``values[b, t]`` = the score head's output at token t (value models; the state after token t).

Only ranks whose ``mesh.is_collect`` is true return these outputs; the others return an
empty ``DataProto`` (a pipeline engine's non-last stages have no per-token outputs, and the
tensor-parallel peers of a collect rank hold the same ones). Metrics come back on every rank.

The loss function contract is in ``LossContext``/``LossFn`` below and in docs/engines.md.
"""

from __future__ import annotations

import abc
import enum
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, Optional

import torch

from rlflow.engines.common.forward.hf_module import hf_named_tensors
from rlflow.engines.config import EngineConfig, EngineConfigError, StepHyperparams
from rlflow.protocol import DataProto

__all__ = ["BaseEngine", "Capability", "EngineMesh", "LossContext", "LossFn"]


@dataclass(frozen=True)
class EngineMesh:
    """Where this process sits in the engine's data-parallel layout (used by mesh dispatch).

    ``dp_rank`` / ``dp_size`` count DP groups: all ranks that hold one model replica
    together (its tensor- and pipeline-parallel ranks) form one group and share one
    ``dp_rank``. Mesh dispatch sends each DP chunk to every rank of its group and
    concatenates, in ``dp_rank`` order, the outputs of the one ``is_collect`` rank per
    group: the rank that returns outputs (for a TP/PP engine, TP rank 0 of the last
    pipeline stage; for a pure data-parallel engine, every rank).
    """

    dp_rank: int
    dp_size: int
    is_collect: bool


@dataclass(frozen=True)
class LossContext:
    """Global facts about the mini-batch that a micro-batch loss needs to be scaled correctly.

    Counts are over the WHOLE mini-batch: every micro-batch on every DP rank.

    * ``global_num_tokens``: sum of ``loss_mask`` (verl's ``batch_num_tokens``);
    * ``global_num_seqs``: rows (sequences) in the mini-batch (verl's ``global_batch_size``);
    * ``dp_size``: ranks whose gradients the engine averages.

    The engine backprops the loss that ``loss_fn`` returns unchanged, and its gradient
    reduction AVERAGES over ``dp_size`` ranks. So a micro-batch must return

        loss_mb = dp_size * (contribution of its tokens to the global mini-batch loss)

    e.g. token-mean: ``dp_size * sum(l * mask) / global_num_tokens``;
    seq-mean-token-mean: ``dp_size * sum_seq(mean_t l) / global_num_seqs``.
    Summed over micro-batches and averaged over ranks, the gradient is then exactly
    the gradient of the global loss, whatever the micro-batch split. This is the
    convention of verl's ``agg_loss(..., dp_size, batch_num_tokens, global_batch_size)``,
    which can be called with these fields directly.
    """

    global_num_tokens: int
    global_num_seqs: int
    dp_size: int
    num_micro_batches: int
    micro_batch_index: int


class Capability(str, enum.Enum):
    """Optional features an engine declares in ``BaseEngine.capabilities``.

    ``BaseEngine.__init__`` refuses a config or model kind that needs an undeclared one
    (one clear line instead of a silently ignored option), and the engine test suite runs
    a scenario on exactly the engines that declare what it needs.
    """

    MIXED_PRECISION = "mixed_precision"  # param_dtype != dtype: compute in param_dtype, master weights in dtype
    VALUE_MODEL = "value_model"  # model_kind="value": an HF classification model with one label (critic, reward model)
    RESHARD = "reshard"  # load_checkpoint takes a checkpoint written at another world size (same layout otherwise)
    LORA = "lora"  # lora.rank > 0: train low-rank adapters; the LoRA methods below work (docs/lora.md)
    SEQUENCE_PARALLEL = "ulysses_sequence_parallel"  # ulysses_sequence_parallel_size > 1 splits sequences over ranks


LossFn = Callable[[dict[str, torch.Tensor], DataProto, LossContext], "tuple[torch.Tensor, dict[str, float]]"]
"""``loss_fn(outputs, micro_batch, ctx) -> (loss, metrics)``.

``outputs`` are the micro-batch's per-token model outputs (``[b, T]``, same rows and
columns as ``micro_batch``, differentiable); ``micro_batch`` is the DataProto slice
(all keys the caller put in, e.g. advantages, old_log_probs); ``ctx`` is a ``LossContext``.
``loss`` is a scalar scaled as ``LossContext`` describes; ``metrics`` are floats
averaged over this rank's micro-batches.
"""


class BaseEngine(abc.ABC):
    """Abstract engine: build, run and update one model under one parallel layout.

    Subclasses register with ``@ENGINE_REGISTRY.register("name")``, set ``config_class``
    to their ``EngineConfig`` subclass and ``capabilities`` to the optional features
    they implement. Construction is cheap; ``initialize()`` does the heavy work, so a
    Ray worker can build then initialize. All methods except ``mesh`` are collective:
    every rank of the engine calls them in the same order.
    """

    config_class: ClassVar[type[EngineConfig]] = EngineConfig
    capabilities: ClassVar[frozenset[Capability]] = frozenset()

    def __init__(self, config: EngineConfig, model_path: str | Path, model_kind: str = "causal_lm") -> None:
        """``model_path``: a local HF folder. ``model_kind``: ``causal_lm`` (outputs log_probs,
        entropy) or ``value`` (an HF classification model with one label; outputs values)."""
        self.config = config
        self.model_path = Path(model_path)
        self.model_kind = model_kind
        self.check_supported(config, model_kind)

    @classmethod
    def check_supported(cls, config: EngineConfig, model_kind: str = "causal_lm") -> None:
        """Raise ``EngineConfigError`` (one line) when ``config`` or ``model_kind`` needs a capability this engine
        lacks. The constructor calls it; config loading calls it for the trained roles before any worker starts."""
        from rlflow.models.loading import resolve_dtype  # lazy: transformers is heavy for config-only imports

        needed = {  # capability -> (needed by this config / model kind, how to do without it)
            Capability.MIXED_PRECISION: (
                resolve_dtype(config.param_dtype) != resolve_dtype(config.dtype),
                f"param_dtype={config.param_dtype} differs from dtype={config.dtype}; set them equal",
            ),
            Capability.VALUE_MODEL: (model_kind == "value", "model_kind=value; host this model on another engine"),
            Capability.LORA: (config.lora.enabled, f"lora.rank={config.lora.rank}; set lora.rank=0 (full fine-tuning) "
                              "or use an engine with LoRA (fsdp, fsdp2)"),
            Capability.SEQUENCE_PARALLEL: (
                config.ulysses_sequence_parallel_size > 1,
                f"ulysses_sequence_parallel_size={config.ulysses_sequence_parallel_size}; set it to 1 or use fsdp, fsdp2",
            ),
        }
        problems = [f"{cap.value} ({fix})" for cap, (needs, fix) in needed.items() if needs and cap not in cls.capabilities]
        if problems:
            raise EngineConfigError(f"engine {config.name!r} does not support {'; '.join(problems)}")

    @classmethod
    def node_local_ranks(cls, config: EngineConfig) -> int:
        """How many adjacent ranks must share a node: a tensor-parallel group exchanges activations in every layer,
        which only a node's own links carry fast enough. 1 (the default): any rank may be on any node."""
        return 1

    @classmethod
    def check_model(cls, config: EngineConfig, model_path: str | Path, model_kind: str, world_size: int) -> None:
        """Raise ``EngineConfigError`` (one line) when this engine cannot run the model folder ``model_path`` on
        ``world_size`` ranks: a model it cannot build, or a parallel layout the model or the world cannot be
        split by. The drivers call it for every role's engine before any worker starts (the worker would
        otherwise find out after Ray has started); the default checks nothing."""

    @abc.abstractmethod
    def initialize(self) -> None:
        """Load the model from ``model_path``, wrap it for parallelism, build optimizer and LR schedule."""

    @abc.abstractmethod
    def forward_backward(
        self, batch: DataProto, loss_fn: Optional[LossFn] = None, forward_only: bool = False
    ) -> tuple[DataProto, dict[str, Any]]:
        """Run ``batch`` (this rank's share of a mini-batch) in micro-batches.

        Splits by ``micro_batch_size`` or, with ``use_dynamic_bsz``, by the token budget
        (balanced; every DP rank runs the same number of micro-batches); packs each
        micro-batch without padding when ``use_remove_padding``. For each micro-batch it
        calls ``loss_fn(outputs, micro_batch, ctx)`` and, unless ``forward_only``,
        backprops the returned loss (gradients accumulate until ``optim_step``).

        Returns ``(outputs, metrics)``: ``outputs`` a DataProto of detached per-token
        tensors (``log_probs`` [+ ``entropy``] or ``values``) in the input row order on
        ``mesh.is_collect`` ranks, an empty DataProto on the others; ``metrics`` on every
        rank, with ``loss`` (the global mini-batch loss, identical on all ranks), the
        global counts, and the loss_fn's metrics averaged over micro-batches.
        """

    @abc.abstractmethod
    def optim_step(self, lr: Optional[float] = None, hyperparams: Optional[StepHyperparams] = None) -> dict[str, Any]:
        """Clip, step and zero the gradients, then advance the LR schedule by one step.

        ``lr`` replaces the scheduled learning rate for this one step only; ``hyperparams`` replace
        the configured AdamW betas, eps, weight decay and gradient clip where set (the Tinker service). When the
        gradient norm is not finite the update is skipped (gradients are dropped) and
        counted. Returns ``{"grad_norm", "lr", "skipped", "skipped_steps"}``.
        """

    @abc.abstractmethod
    def zero_grad(self) -> None:
        """Drop accumulated gradients without stepping."""

    def reset_optimizer(self) -> None:
        """Forget the optimizer's state (AdamW's moments and step counts) and start the LR schedule over, so the
        next step is a new optimizer's first: the Tinker service's ``load_state`` without the optimizer. An engine
        that cannot raises ``NotImplementedError``."""
        raise NotImplementedError(f"engine {type(self).__name__} cannot reset its optimizer's state")

    @abc.abstractmethod
    def train_mode(self) -> AbstractContextManager[None]:
        """Context manager: modules in training mode (dropout on) inside, previous mode restored after."""

    @abc.abstractmethod
    def eval_mode(self) -> AbstractContextManager[None]:
        """Context manager: modules in eval mode inside, previous mode restored after."""

    @abc.abstractmethod
    def offload(self) -> None:
        """Move parameters, gradients and optimizer state to host memory (frees the accelerator)."""

    @abc.abstractmethod
    def onload(self) -> None:
        """Move everything ``offload`` moved back to the compute device."""

    @abc.abstractmethod
    def save_checkpoint(self, path: str | Path) -> None:
        """Write a resumable checkpoint (model, optimizer, LR schedule, RNG, step) atomically to ``path``."""

    @abc.abstractmethod
    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint written by ``save_checkpoint`` under the same layout and world size
        (any world size for an engine with ``Capability.RESHARD``).

        Raises ``rlflow.errors.CheckpointError`` when ``path`` holds no complete checkpoint or
        the setup differs (the message lists what differs).
        """

    @abc.abstractmethod
    def export_hf_weights(self, dtype: Optional[torch.dtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, full_tensor)`` one tensor at a time; collective.

        EVERY rank yields the complete model: all HF names of the checkpoint the model
        came from (tied weights once), in the same order on every rank. An engine that
        shards by tensor parallelism gathers each tensor's shards; a pipeline engine
        broadcasts each stage's tensors over its pipeline group. Either way memory stays
        bounded by one full tensor (or one sharding unit). Each tensor is cast to
        ``dtype`` (None: the stored dtype); the rollout passes its own dtype.
        """

    @abc.abstractmethod
    def save_hf(self, path: str | Path) -> None:
        """Write an HF folder (weights in the stored dtype, config, tokenizer files of the source
        folder) that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load. Rank 0 writes; all ranks must call."""

    # ------------------------------------------------------------------ LoRA (Capability.LORA)
    def adapters_disabled(self) -> AbstractContextManager[None]:
        """Context manager: the LoRA adapters are off inside, so forwards give the base model's outputs
        (a LoRA actor's reference policy, with no second copy of the weights); collective like a forward."""
        raise self._no_adapters()

    def export_lora_adapter(self, dtype: Optional[torch.dtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield the adapters alone as ``(peft file name, full tensor)``, ``export_hf_weights``' rules otherwise
        (collective; every rank yields all of them). ``export_hf_weights`` yields the merged model."""
        raise self._no_adapters()

    def lora_adapter_config(self) -> str:
        """The ``adapter_config.json`` text of a peft folder holding this engine's adapters."""
        raise self._no_adapters()

    def save_lora_adapter(self, path: str | Path) -> None:
        """Write the adapters as a peft adapter folder that ``PeftModel.from_pretrained`` loads
        (rank 0 writes; all ranks must call)."""
        raise self._no_adapters()

    def _no_adapters(self) -> EngineConfigError:
        return EngineConfigError(f"engine {self.config.name!r} has no LoRA adapters (lora.rank={self.config.lora.rank})")

    @classmethod
    def checkpoint_hf_tensors(
        cls, state: Iterable[tuple[str, torch.Tensor]], model_files: Path
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """HF ``(name, tensor)`` pairs from the model state of a checkpoint this engine wrote, offline.

        ``rlflow-export`` reads the checkpoint's model state on one process (``(state name, full
        tensor)``, in saved order) and calls this on the class named in its ``engine_meta.json``;
        ``model_files`` is the HF folder with the model's ``config.json``. The default is the
        naming of engines that shard the HF module itself: ``"model." + hf_name`` (fsdp, fsdp2,
        DDP); an engine with another model implementation maps its names as its live export does.
        """
        return hf_named_tensors(state)

    @property
    @abc.abstractmethod
    def mesh(self) -> EngineMesh:
        """This rank's ``EngineMesh`` (dp_rank, dp_size, is_collect)."""
