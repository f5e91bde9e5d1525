"""Build this rank's pipeline stage of a megatron ``GPTModel`` from an HF folder, and its optimizer.

``build_stage`` loads the HF model through rlflow's loader (the same path as every engine: a
value model loaded from a causal-LM folder gets the same fresh, seeded score head), builds the
``GPTModel`` stage (first stage: embeddings; last stage: final norm and output layer, or a value
model's ``value_head`` instead of the output layer), and copies each parameter's shard from the
HF weights (``weights.whole_from_hf`` then ``shard_of``).

``GradBufferAdamW`` is AdamW over the gradients megatron's DDP keeps in its contiguous buffers
(``param.main_grad``): a plain torch optimizer would see no ``.grad`` at all (PLATFORM.md).
With the distributed optimizer its AdamW steps this data-parallel rank's shares of the parameters
(``optimizer_shares``). ``HostParking`` holds the parameters and those buffers in host memory while they are offloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from megatron.core.distributed import DistributedDataParallel as MegatronDDP
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import nn
from transformers import PretrainedConfig

from rlflow.engines.common.forward.hf_config import head_dim
from rlflow.engines.megatron.architecture import ModelLayout, gpt_model_kwargs, layer_spec, padded_vocab_size
from rlflow.engines.megatron.forward import StageForward
from rlflow.engines.megatron.optimizer_shares import OptimizerShares
from rlflow.engines.megatron.parallel import ParallelRanks
from rlflow.engines.megatron.weights import ModelShape, global_name, shard_of, whole_from_hf
from rlflow.models.value_models import value_head as value_head_of

__all__ = ["GradBufferAdamW", "StagePlan", "model_shape", "build_stage", "megatron_names"]

MODEL_PREFIX = "module."  # StageForward holds the GPTModel as .module


def model_shape(hf: PretrainedConfig, layout: ModelLayout) -> ModelShape:
    """What the weight mapping needs from the HF config."""
    return ModelShape(
        num_heads=hf.num_attention_heads, num_groups=hf.num_key_value_heads, head_dim=head_dim(hf),
        vocab_size=hf.vocab_size, padded_vocab_size=padded_vocab_size(hf.vocab_size, layout),
    )


@dataclass(frozen=True)
class StagePlan:
    """What every rank builds its stage from: the HF config, the layout, causal LM or value model, tied embeddings."""

    hf: PretrainedConfig
    layout: ModelLayout
    value_model: bool
    tied: bool  # the output layer is the input embeddings (causal LMs with tie_word_embeddings)
    logprob_chunk_size: int

    def layer_offset(self, stage: int) -> int:
        return self.layout.layer_offset(stage, self.hf.num_hidden_layers)


def megatron_names(stage: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``StageForward``'s parameters under megatron's local names (``decoder.layers.0...``, ``value_head.weight``)."""
    return [(name.removeprefix(MODEL_PREFIX), param) for name, param in stage.named_parameters()]


def build_stage(plan: StagePlan, config: TransformerConfig, hf_model: nn.Module, ranks: ParallelRanks,
                dtype: torch.dtype) -> StageForward:
    """This rank's ``StageForward`` with its shards of ``hf_model``'s weights."""
    gpt = GPTModel(
        config=config, transformer_layer_spec=layer_spec(config, ranks.pp_rank), pre_process=ranks.is_first_stage,
        post_process=ranks.is_last_stage, **gpt_model_kwargs(plan.hf, plan.layout, tie_output=plan.tied),
    )
    if config.sequence_parallel and gpt.post_process and not plan.value_model:
        # StageForward gathers the final hidden states over the sequence itself, so the output layer takes whole
        # sequences, as without sequence parallelism: no gather of its own, its input gradient all-reduced
        gpt.output_layer.sequence_parallel, gpt.output_layer.allreduce_dgrad = False, True
    value_head = None
    if plan.value_model and ranks.is_last_stage:
        del gpt.output_layer  # a value model has a one-output score head instead of the vocabulary
        gpt.output_layer = None
        hf_head = value_head_of(hf_model)  # a token-classification head has a bias, a sequence-classification one not
        value_head = nn.Linear(plan.hf.hidden_size, 1, bias=hf_head.bias is not None, dtype=dtype)
    stage = StageForward(gpt, value_head=value_head, vocab_size=plan.hf.vocab_size,
                         padding_idx=hf_model.get_input_embeddings().padding_idx, tp_rank=ranks.tp_rank,
                         tp_group=ranks.tp_group, logprob_chunk_size=plan.logprob_chunk_size)
    hf_state = hf_model.state_dict()
    shape = model_shape(plan.hf, plan.layout)
    offset = plan.layer_offset(ranks.pp_rank)
    with torch.no_grad():
        for name, param in megatron_names(stage):
            whole = whole_from_hf(global_name(name, offset), hf_state, shape, plan.tied)
            param.copy_(shard_of(name, whole, ranks.tp_rank, ranks.tp_size))
    return stage


class GradBufferAdamW:
    """AdamW (``optimizer``) stepping on megatron DDP's grad buffers; what ``OptimizerStepper`` drives. With
    ``shares`` (the distributed optimizer or fp32 masters) the AdamW is over this data-parallel rank's shares of the parameters, and
    a step ends by all-gathering every rank's shares."""

    def __init__(self, optimizer: torch.optim.Optimizer, ddp: MegatronDDP,
                 shares: Optional[OptimizerShares] = None) -> None:
        self.optimizer, self.ddp, self.shares = optimizer, ddp, shares
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.whole = self.params if shares is None else [param for _, param in shares.params]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def attach_grads(self) -> None:
        """Point each parameter's ``.grad`` at its (reduced) ``main_grad`` for the clip norm, and each share's at its
        elements for the step."""
        for param in self.whole:
            param.grad = param.main_grad if param.main_grad.dtype == param.dtype else param.main_grad.to(param.dtype)
        if self.shares is not None:
            self.shares.attach_grads()

    def step(self) -> None:
        self.optimizer.step()
        if self.shares is not None:
            self.shares.step_done()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        for param in self.whole:  # megatron's backward hook adds a parameter's .grad into its main_grad
            param.grad = None
        self.ddp.zero_grad_buffer()


class HostParking:
    """Tensors whose bytes wait in host memory while their device storage is empty: how the megatron
    engine offloads its parameters and DDP's gradient buffers.

    Megatron's DDP hooks each parameter's gradient accumulator, and ``param.main_grad`` / each bucket's
    ``grad_data`` are views of one gradient buffer per dtype. ``.to()`` would unhook the parameters
    (torch gives a tensor whose device changes a new accumulator, so gradients would bypass
    ``main_grad``) and cut the views off their buffer. Parking keeps every tensor object and its device:
    ``park`` copies each tensor's bytes to the host and empties its storage (``resize_(0)``), ``restore``
    refills the storage and copies them back. (Megatron's own ``offload_grad_buffers`` empties the
    gradient storage without the copy, losing gradients pending between ``forward_backward`` and
    ``optim_step``.) Each tensor must own its storage.
    """

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.parked: list[tuple[torch.Tensor, int]] = []

    def park(self) -> None:
        if self.parked:
            return
        for tensor in self.tensors:
            self.parked.append((tensor.detach().to("cpu", copy=True), tensor.untyped_storage().nbytes()))
            tensor.untyped_storage().resize_(0)

    def restore(self) -> None:
        for tensor, (host, nbytes) in zip(self.tensors, self.parked):
            tensor.untyped_storage().resize_(nbytes)
            tensor.detach().copy_(host)
        self.parked = []
