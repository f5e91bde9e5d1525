"""Typed engine configuration, in two layers.

* ``EngineConfig``: what every engine honours, whatever it is built on (FSDP, Megatron,
  torchtitan ...): device, dtypes, optimizer, LR schedule, micro-batching, packing,
  activation recomputation, offload, seed.
* ``HFModuleEngineConfig``: what only an engine that runs the Hugging Face module
  itself can honour (the HF attention kernel, the chunked log-prob head, which HF
  classes are the decoder layers).

Each engine class names its own dataclass (``config_class``), a subclass of one of
these that adds the engine's parallelism options. A Hydra node for an engine
(``rlflow/configs/engine/<name>.yaml``, mounted at ``actor.engine`` ...) is checked against
that dataclass, so a misspelled key fails at start-up with its name. The model folder
is not part of this config: it comes from the role that builds the engine
(``build_engine(config, model_path=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlflow.config.ranges import AT_LEAST_1, FRACTION, NON_NEGATIVE, POSITIVE, SEED, Range, Ranges, range_errors
from rlflow.errors import UserError

__all__ = [
    "ADAMW_IMPLEMENTATIONS",
    "EngineConfig",
    "EngineConfigError",
    "HFModuleEngineConfig",
    "LRSchedulerConfig",
    "LoRAConfig",
    "OptimizerConfig",
    "StepHyperparams",
    "ULYSSES_KERNELS",
    "config_from_mapping",
]

# torch.optim.AdamW's kernels (names as torchtitan's optimizer.implementation): one fused kernel per
# parameter group, multi-tensor ops over the parameter list, or a Python loop over the parameters.
ADAMW_IMPLEMENTATIONS = ("fused", "foreach", "for-loop")
# attention kernels that attend within each packed sequence with no mask: the ones Ulysses sequence parallelism can
# hand whole sequences (rlflow.engines.common.forward.ulysses)
ULYSSES_KERNELS = ("sdpa_varlen", "flash_attention_2", "flash_attention_3")


class EngineConfigError(UserError, ValueError):
    """An engine option is unknown, mistyped or out of range; the message names the key."""


@dataclass
class OptimizerConfig:
    """AdamW settings. Weight decay never applies to biases and normalization weights."""

    lr: float = 1e-6
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max global grad norm; <= 0 measures the norm without clipping
    implementation: str = "foreach"  # foreach | fused | for-loop: torch.optim.AdamW's kernels (docs/engines.md)

    RANGES: ClassVar[Ranges] = {"lr": NON_NEGATIVE, "betas": Range(0, 1, high_open=True), "eps": NON_NEGATIVE,
                                "weight_decay": NON_NEGATIVE, "grad_clip": Range(note="<= 0: measure without clipping")}


@dataclass(frozen=True)
class StepHyperparams:
    """AdamW settings for one ``optim_step``, each replacing the configured one where set (the Tinker API
    sends the whole set with every step). ``weight_decay`` applies to the parameters that decay (not
    biases and norm weights); ``grad_clip`` <= 0 measures the norm without clipping."""

    betas: Optional[tuple[float, float]] = None
    eps: Optional[float] = None
    weight_decay: Optional[float] = None
    grad_clip: Optional[float] = None


@dataclass
class LRSchedulerConfig:
    """Learning-rate schedule: linear warmup, then a registered decay shape."""

    name: str = "constant"  # constant | linear | cosine (rlflow.engines.common.optim.lr_schedulers)
    warmup_steps: int = 0  # step s < warmup_steps runs at lr * (s + 1) / warmup_steps
    min_lr_ratio: float = 0.0  # decay floor as a fraction of lr
    total_steps: int = 0  # optimizer steps in the run; linear/cosine decay needs it > warmup_steps

    RANGES: ClassVar[Ranges] = {"warmup_steps": NON_NEGATIVE, "min_lr_ratio": FRACTION,
                                "total_steps": Range(0, note="0: the run's length")}


LORA_PARTS = ("attention", "mlp", "unembedding")


@dataclass
class LoRAConfig:
    """Low-rank adapters (``peft``) on the model's linear layers; ``rank`` 0 is full fine-tuning.

    ``target_modules`` names linear layers by their last name component (``q_proj``) or full
    module path, or is ``[all-linear]``: every linear layer of the parts in ``parts``
    (``attention``, ``mlp``, ``unembedding``: the LM head). ``adapter_path`` starts from a saved
    ``peft`` adapter folder instead of fresh adapters (A random, B zero). docs/lora.md.
    """

    rank: int = 0  # adapter rank r; 0: no adapters (full fine-tuning)
    alpha: float = 16.0  # the adapter output is scaled by alpha / rank
    dropout: float = 0.0  # dropout on the adapter input
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    parts: list[str] = field(default_factory=lambda: ["attention", "mlp"])  # which parts all-linear covers
    adapter_path: Optional[str] = None  # a peft adapter folder to start from

    RANGES: ClassVar[Ranges] = {"rank": Range(0, note="0: no adapters"), "alpha": POSITIVE,
                                "dropout": Range(0, 1, high_open=True)}

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class EngineConfig:
    """Options every engine honours: device, dtypes, optimizer, schedule, batching, packing, offload, seed."""

    name: str = "???"
    device: str = "auto"  # auto | cpu | cuda (rlflow.utils.device)
    dtype: str = "float32"  # storage dtype of the (master) weights and optimizer state
    param_dtype: str = "float32"  # compute dtype; bfloat16 with dtype=float32 is mixed precision
    reduce_dtype: str = "float32"  # dtype of the gradient reduction across data-parallel ranks
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lr_scheduler: LRSchedulerConfig = field(default_factory=LRSchedulerConfig)
    micro_batch_size: int = 4  # sequences per forward/backward when use_dynamic_bsz is false
    use_dynamic_bsz: bool = False  # size micro-batches by a token budget instead of a sequence count
    max_token_len_per_micro_batch: int = 4096  # token budget of one micro-batch (use_dynamic_bsz)
    # Forward-only passes (log-probs, reference, values, reward scores, validation loss); null: the three above.
    forward_micro_batch_size: Optional[int] = None
    forward_use_dynamic_bsz: Optional[bool] = None
    forward_max_token_len_per_micro_batch: Optional[int] = None
    use_remove_padding: bool = True  # pack a micro-batch's valid tokens into one row (no padding compute)
    gradient_checkpointing: bool = False  # recompute decoder-layer activations in backward
    param_offload: bool = False  # keep parameters and grads in host memory between engine calls
    optimizer_offload: bool = False  # keep optimizer state in host memory between optimizer steps
    seed: int = 0  # base seed; rank r seeds torch/numpy/python with seed + r
    trust_remote_code: bool = False  # let the HF load run modeling code shipped in the folder (YAML: model.trust_remote_code)
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # rank > 0: train low-rank adapters only (docs/lora.md)
    ulysses_sequence_parallel_size: int = 1  # > 1: split each micro-batch's tokens over this many ranks (docs/engines.md)

    # Numeric keys (rlflow.config.ranges); a subclass declares its own fields' ranges in its own RANGES.
    RANGES: ClassVar[Ranges] = {"micro_batch_size": AT_LEAST_1, "max_token_len_per_micro_batch": AT_LEAST_1,
                                "forward_micro_batch_size": AT_LEAST_1,
                                "forward_max_token_len_per_micro_batch": AT_LEAST_1, "seed": SEED,
                                "ulysses_sequence_parallel_size": AT_LEAST_1}

    def range_checks(self) -> dict[str, bool]:
        """``{dotted key: value is legal}`` for what ``RANGES`` cannot say (lengths, names); a subclass adds its own
        keys to ``super().range_checks()``."""
        return {
            "optimizer.betas": len(self.optimizer.betas) == 2,
            "optimizer.implementation": self.optimizer.implementation in ADAMW_IMPLEMENTATIONS,
            "lora.target_modules": len(self.lora.target_modules) > 0,
            "lora.parts": bool(self.lora.parts),
        }

    def micro_batch_limits(self, training: bool) -> dict[str, Any]:
        """``plan_micro_batches``' size arguments for a pass that trains (a backward follows) or only runs forward."""
        if training:
            return {"micro_batch_size": self.micro_batch_size, "use_dynamic_bsz": self.use_dynamic_bsz,
                    "max_token_len": self.max_token_len_per_micro_batch}
        return {
            "micro_batch_size": self.forward_micro_batch_size or self.micro_batch_size,
            "use_dynamic_bsz": self.use_dynamic_bsz if self.forward_use_dynamic_bsz is None else self.forward_use_dynamic_bsz,
            "max_token_len": self.forward_max_token_len_per_micro_batch or self.max_token_len_per_micro_batch,
        }

    def combination_errors(self) -> list[str]:
        """One message per combination of options this config cannot run; a subclass adds its own."""
        return []


@dataclass
class HFModuleEngineConfig(EngineConfig):
    """Options only an engine that runs the Hugging Face module itself honours (fsdp, fsdp2, ...)."""

    attn_implementation: str = "sdpa"  # sdpa | sdpa_varlen | eager | flash_attention_2 | flex_attention
    logprob_chunk_size: int = 1024  # tokens per chunk when turning hidden states into log-probs
    wrap_layer_classes: list[str] = field(default_factory=list)  # decoder-layer classes; empty: _no_split_modules
    share_prefix: bool = False  # run a prefix several rows share (a GRPO group's prompt) once (prefix_sharing.py)

    RANGES: ClassVar[Ranges] = {"logprob_chunk_size": AT_LEAST_1}

    def combination_errors(self) -> list[str]:
        errors = super().combination_errors()
        if self.share_prefix and (self.attn_implementation != "sdpa_varlen" or not self.use_remove_padding):
            errors.append("share_prefix=true needs attn_implementation=sdpa_varlen and use_remove_padding=true "
                          "(only that kernel attends across a shared prefix), got "
                          f"attn_implementation={self.attn_implementation}, use_remove_padding={self.use_remove_padding}")
        if self.ulysses_sequence_parallel_size > 1:
            errors.extend(self._sequence_parallel_errors())
        return errors

    def _sequence_parallel_errors(self) -> list[str]:
        size = f"ulysses_sequence_parallel_size={self.ulysses_sequence_parallel_size}"
        errors = []
        if self.attn_implementation not in ULYSSES_KERNELS or not self.use_remove_padding:
            errors.append(f"{size} needs use_remove_padding=true and attn_implementation in {list(ULYSSES_KERNELS)} "
                          "(a packed stream the ranks split, attended without a mask), got "
                          f"attn_implementation={self.attn_implementation}, use_remove_padding={self.use_remove_padding}")
        if self.share_prefix:
            errors.append(f"{size} cannot run with share_prefix=true (a shared prefix predicts tokens away from "
                          "its own slot); set share_prefix=false")
        return errors


ConfigT = TypeVar("ConfigT", bound=EngineConfig)


def config_from_mapping(config_class: type[ConfigT], values: Mapping[str, Any] | Any) -> ConfigT:
    """Build ``config_class`` from a dict / DictConfig / dataclass, rejecting unknown keys and wrong types."""
    if isinstance(values, config_class):
        return values
    try:
        merged = OmegaConf.merge(OmegaConf.structured(config_class), values)
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "") or ""
        message = str(error).split("\n")[0]
        raise EngineConfigError(f"engine config key '{key}' ({config_class.__name__}): {message}") from None
    _check_values(config)
    return config


def _check_values(config: EngineConfig) -> None:
    for message in range_errors(config, type(config)):
        raise EngineConfigError(f"engine {message} ({type(config).__name__})")
    bad = [key for key, ok in config.range_checks().items() if not ok]
    if bad:
        detail = ", ".join(f"{key}={_lookup(config, key)!r}" for key in bad)
        raise EngineConfigError(f"engine config values out of range: {detail}")
    conflicts = config.combination_errors()
    if conflicts:
        raise EngineConfigError(f"engine config: {'; '.join(conflicts)}")


def _lookup(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config
