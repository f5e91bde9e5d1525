"""The Tinker API's built-in loss functions, as engine ``LossFn``s, in ``TINKER_LOSS_REGISTRY`` by Tinker name.

A Tinker datum is one sequence: ``model_input`` (N tokens) and per-position ``loss_fn_inputs``
(``target_tokens``, ``weights``, the sampler's ``logprobs``, ``advantages``), where position
``i`` predicts ``target_tokens[i]``. ``rlflow.service.batches`` lays a datum out as the engine
sequence ``model_input + [target_tokens[-1]]`` with every per-position input moved one column
right, so column ``t`` holds the inputs of the token that the engine's ``log_probs[:, t]`` scores.

Every Tinker loss is a SUM over tokens, not a mean: the client scales with ``weights`` or
``advantages``. Under the engine's scaling convention (``LossContext``) a micro-batch returns
``dp_size * (its tokens' sum)``, and its ``loss:sum`` metric is that times the number of
micro-batches, so that the engine's micro-batch mean and the controller's DP mean give back the
global sum (``rlflow.roles.losses`` does the same for the RL metrics).

``gspo`` is Tinker's GSPO-token (published in its docs); its default clip thresholds are the GSPO paper's
(``1 - 3e-4``, ``1 + 4e-4``), since Tinker's are not published: pass both to match a Tinker run. Of the SDK's
names, ``stable_reinforce`` is not registered (its objective needs sampling-time stability information that Tinker
records on its own servers and does not publish), nor is ``custom``, a loss the client uploaded
(``rlflow.service.custom_losses``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from rlflow.engines import LossContext, LossFn
from rlflow.errors import UserError
from rlflow.protocol import DataProto
from rlflow.utils.registry import Registry

# Tinker's loss input name -> the engine batch column that holds it, one column right of the datum.
INPUT_COLUMNS = {"weights": "target_weights", "logprobs": "sampling_logprobs", "advantages": "advantages",
                 "sequence_ratio_mask": "sequence_ratio_mask"}
TokenLoss = Callable[[torch.Tensor, DataProto, Mapping[str, float]], torch.Tensor]


class LossInputError(UserError, ValueError):
    """A datum lacks an input its loss function needs, or names an unknown loss configuration key."""


# Each entry is ``token_loss(log_probs, micro_batch, loss_fn_config) -> per-token loss [b, T]`` under its Tinker
# name, registered with ``inputs=`` (the ``loss_fn_inputs`` it needs besides ``target_tokens``; none if left out)
# and ``config=`` (the ``loss_fn_config`` keys it reads, with their defaults; none if left out).
TINKER_LOSS_REGISTRY: Registry[TokenLoss] = Registry("loss function", "loss_fn", error=LossInputError)


def loss_inputs(name: str) -> tuple[str, ...]:
    """The ``loss_fn_inputs`` (besides ``target_tokens``) that loss ``name`` needs (unknown: ``LossInputError``)."""
    return tuple(TINKER_LOSS_REGISTRY.metadata(name).get("inputs", ()))


def loss_config(name: str, given: Mapping[str, Any] | None) -> dict[str, float]:
    """``loss_fn_config`` for ``name``: its defaults with ``given`` on top; an unknown key is refused."""
    defaults = dict(TINKER_LOSS_REGISTRY.metadata(name).get("config", {}))
    unknown = sorted(set(given or {}) - set(defaults))
    if unknown:
        raise LossInputError(f"loss_fn_config keys {unknown} are not read by {name!r} (it reads {sorted(defaults) or 'none'})")
    text = sorted(key for key, value in (given or {}).items() if isinstance(value, str))
    if text:
        raise LossInputError(f"loss_fn_config keys {text} of {name!r} must be numbers, got text")
    return {**defaults, **{key: float(value) for key, value in (given or {}).items()}}


def _column(micro: DataProto, name: str) -> torch.Tensor:
    return micro.batch[INPUT_COLUMNS[name]]


def _ratio(log_probs: torch.Tensor, micro: DataProto) -> torch.Tensor:
    return torch.exp(log_probs - _column(micro, "logprobs"))


@TINKER_LOSS_REGISTRY.register("cross_entropy")
def cross_entropy(log_probs: torch.Tensor, micro: DataProto, config: Mapping[str, float]) -> torch.Tensor:
    """Weighted negative log-likelihood of the targets (``weights`` is optional: 1 where absent)."""
    return -_column(micro, "weights") * log_probs


@TINKER_LOSS_REGISTRY.register("importance_sampling", inputs=("logprobs", "advantages"))
def importance_sampling(log_probs: torch.Tensor, micro: DataProto, config: Mapping[str, float]) -> torch.Tensor:
    """REINFORCE corrected for the sampler: ``-(p/q) * A``."""
    return -_ratio(log_probs, micro) * _column(micro, "advantages")


@TINKER_LOSS_REGISTRY.register("ppo", inputs=("logprobs", "advantages"),
                               config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
def ppo(log_probs: torch.Tensor, micro: DataProto, config: Mapping[str, float]) -> torch.Tensor:
    """PPO's clipped surrogate, token by token: ``-min(r A, clip(r, low, high) A)``."""
    ratio, advantages = _ratio(log_probs, micro), _column(micro, "advantages")
    clipped = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])
    return -torch.minimum(ratio * advantages, clipped * advantages)


@TINKER_LOSS_REGISTRY.register("cispo", inputs=("logprobs", "advantages"),
                               config={"clip_low_threshold": 0.0, "clip_high_threshold": 4.0})
def cispo(log_probs: torch.Tensor, micro: DataProto, config: Mapping[str, float]) -> torch.Tensor:
    """CISPO: the clipped ratio as a constant weight on the log-likelihood, ``-sg(clip(r)) * log p * A``."""
    weight = _ratio(log_probs, micro).detach().clamp(config["clip_low_threshold"], config["clip_high_threshold"])
    return -weight * log_probs * _column(micro, "advantages")


@TINKER_LOSS_REGISTRY.register("dro", inputs=("logprobs", "advantages"), config={"beta": 0.1})
def dro(log_probs: torch.Tensor, micro: DataProto, config: Mapping[str, float]) -> torch.Tensor:
    """DRO: the policy gradient with a quadratic penalty on the drift from the sampler,
    ``-(log p * A - beta / 2 * (log p - log q)^2)``."""
    drift = log_probs - _column(micro, "logprobs")
    return -(log_probs * _column(micro, "advantages") - 0.5 * config["beta"] * drift.square())


@TINKER_LOSS_REGISTRY.register("gspo", inputs=("logprobs", "advantages", "sequence_ratio_mask"),
                               config={"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4})
def gspo(log_probs: torch.Tensor, micro: DataProto, config: Mapping[str, float]) -> torch.Tensor:
    """GSPO-token: every token carries its sequence's ratio, the geometric mean of ``p/q`` over the tokens
    ``sequence_ratio_mask`` marks, with its own log-prob's gradient, in PPO's clipped surrogate."""
    marked = (_column(micro, "sequence_ratio_mask") != 0).to(log_probs.dtype)
    drift = (log_probs.detach() - _column(micro, "logprobs")) * marked
    sequence_log_ratio = drift.sum(dim=-1, keepdim=True) / marked.sum(dim=-1, keepdim=True).clamp(min=1)
    ratio = torch.exp(sequence_log_ratio + log_probs - log_probs.detach())
    advantages = _column(micro, "advantages")
    clipped = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])
    return -torch.minimum(ratio * advantages, clipped * advantages)


def make_loss_fn(name: str, config: Mapping[str, float]) -> LossFn:
    """The engine ``LossFn`` of Tinker loss ``name``: the masked sum of its per-token loss (see the module doc)."""
    token_loss = TINKER_LOSS_REGISTRY.get(name)

    def loss_fn(outputs: dict[str, torch.Tensor], micro: DataProto, ctx: LossContext) -> tuple[torch.Tensor, dict]:
        mask = micro.batch["loss_mask"].to(outputs["log_probs"].dtype)
        loss = ctx.dp_size * (token_loss(outputs["log_probs"], micro, config) * mask).sum()
        return loss, {"loss:sum": float(loss.detach()) * ctx.num_micro_batches}

    return loss_fn
