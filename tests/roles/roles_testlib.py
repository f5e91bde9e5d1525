"""Shared pieces of the role tests.

* ``StandInEngine`` / ``RecordingEngine`` and ``rl_batch``: unit tests of a role around an engine
  (each stand-in records what the role asked of it);
* real roles in this process, on a one-process gloo group (``role_config``: the composed and
  validated PPO config a run would hand the role; ``engine_params``: the built-in engines that
  declare what a role needs, the default one in ``make test`` and the others in ``make test-full``);
* ``token_batch``: an RL batch of real token ids (left-padded prompts, right-padded responses);
* independent references from plain HF models, one unpadded forward per row:
  ``hf_response_log_probs``, ``hf_token_scores``, and ``assert_response_close`` to compare with them.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from engine_lists import builtin_engines_with
from omegaconf import DictConfig

from rlflow.engines import EngineMesh, LossContext
from rlflow.engines.base import Capability
from rlflow.protocol import DataProto
from rlflow.trainer.entry_points import compose_ppo_config

PROMPT, RESPONSE, ROWS = 3, 4, 2
ENGINE_MOUNTS = ("actor", "critic", "ref", "reward.reward_model")
DEFAULT_ENGINE = "fsdp2"  # every role's engine in rlflow/configs/ppo_trainer.yaml
TEMPERATURE = 0.7
ATOL = 1e-5  # fp32 engine vs fp32 HF forward of the same weights: summation order only (fsdp2: 5e-7 measured)


def engine_params(*needs: Capability) -> list:
    """The built-in engines declaring ``needs``: the default engine as is, the others marked ``full``."""
    return [pytest.param(name, marks=[] if name == DEFAULT_ENGINE else [pytest.mark.full])
            for name in builtin_engines_with(*needs)]


@functools.lru_cache(maxsize=None)
def role_config(model: Path, engine: str, *overrides: str) -> DictConfig:
    """The validated PPO config of a CPU run on ``model`` with every role's engine ``engine`` (micro-batches of
    2 rows, lr 1e-3) and the HF rollout (6 new tokens), plus ``overrides``; composed once per argument list."""
    engines = [f"{mount}.engine{key}" for mount in ENGINE_MOUNTS
               for key in (f"={engine}", ".micro_batch_size=2", ".optimizer.lr=1e-3")]
    return compose_ppo_config([f"model.path={model}", "trainer.device=cpu", "rollout=hf", "data.max_response_length=6",
                               *engines, *overrides])


def rl_batch() -> DataProto:
    width = PROMPT + RESPONSE
    return DataProto.from_dict(
        {
            "input_ids": torch.arange(ROWS * width).reshape(ROWS, width),
            "attention_mask": torch.ones(ROWS, width, dtype=torch.long),
            "responses": torch.zeros(ROWS, RESPONSE, dtype=torch.long),
            "response_mask": torch.ones(ROWS, RESPONSE),
        }
    )


def token_batch(seed: int, vocab: int, rows: int = 5, prompt: int = 5, response: int = 6) -> DataProto:
    """Prompts of 1..``prompt`` tokens left-padded, responses of 1..``response`` tokens right-padded
    (row 0 fills both, row 1 has one token of each)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(1, prompt + 1, (rows,), generator=generator)
    response_lengths = torch.randint(1, response + 1, (rows,), generator=generator)
    prompt_lengths[:2], response_lengths[:2] = torch.tensor([prompt, 1]), torch.tensor([response, 1])
    input_ids = torch.randint(0, vocab, (rows, prompt + response), generator=generator)
    attention_mask = torch.zeros(rows, prompt + response, dtype=torch.long)
    for row in range(rows):
        attention_mask[row, prompt - prompt_lengths[row] : prompt + response_lengths[row]] = 1
    input_ids = input_ids * attention_mask
    return DataProto.from_dict({
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "responses": input_ids[:, prompt:],
        "response_mask": attention_mask[:, prompt:].float(),
    })


def _rows(data: DataProto):
    """Per row: the real tokens (prompt then response) and the real prompt length."""
    prompt_width = data.batch["input_ids"].shape[1] - data.batch["responses"].shape[1]
    for ids, mask in zip(data.batch["input_ids"], data.batch["attention_mask"].bool()):
        yield ids[mask], int(mask[:prompt_width].sum())


def hf_response_log_probs(model, data: DataProto, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_probs, entropy)`` ``[B, R]`` of the response tokens under the HF causal LM ``model`` at
    ``temperature``, zero on response padding."""
    log_probs, entropy = torch.zeros(data.batch["responses"].shape), torch.zeros(data.batch["responses"].shape)
    for row, (tokens, prompt_length) in enumerate(_rows(data)):
        with torch.no_grad():
            logits = model(tokens[None]).logits[0].double() / temperature
        steps = torch.log_softmax(logits[prompt_length - 1 : -1], dim=-1)  # the distributions of the response tokens
        log_probs[row, : len(steps)] = steps.gather(-1, tokens[prompt_length:, None])[:, 0].float()
        entropy[row, : len(steps)] = -(steps.exp() * steps).sum(-1).float()
    return log_probs, entropy


def hf_token_scores(model, data: DataProto) -> list[torch.Tensor]:
    """Per row: the HF sequence-classification ``model``'s score head on every real token (prompt then response)."""
    scores = []
    for tokens, _ in _rows(data):
        with torch.no_grad():
            hidden = model.model(tokens[None]).last_hidden_state
            scores.append(model.score(hidden)[0, :, 0])
    return scores


def assert_response_close(got: torch.Tensor, expected: torch.Tensor, response_mask: torch.Tensor) -> None:
    """``got`` is ``expected`` within ``ATOL`` on the response tokens and exactly 0 on the response padding."""
    mask = response_mask.bool()
    torch.testing.assert_close(got[mask], expected[mask], atol=ATOL, rtol=0)
    assert not got[~mask].any(), "non-zero outputs on response padding"


def prompt_lengths(data: DataProto) -> list[int]:
    return [prompt_length for _, prompt_length in _rows(data)]


class StandInEngine:
    """Returns fixed per-token outputs and records export requests."""

    def __init__(self, is_collect: bool):
        self.mesh = EngineMesh(dp_rank=0, dp_size=1, is_collect=is_collect)
        self.export_dtypes: list = []

    def eval_mode(self):
        return nullcontext()

    def forward_backward(self, batch: DataProto, loss_fn=None, forward_only: bool = False):
        if not self.mesh.is_collect:
            return DataProto(), {}
        shape = batch.batch["input_ids"].shape
        return DataProto.from_dict({"log_probs": -torch.ones(shape), "entropy": torch.ones(shape), "values": torch.ones(shape)}), {}

    def export_hf_weights(self, dtype=None):
        self.export_dtypes.append(dtype)
        yield "w", torch.ones(2, dtype=dtype or torch.float32)


class RecordingEngine(StandInEngine):
    """A training stand-in: records the view and runs the loss once on it."""

    def __init__(self, is_collect: bool):
        super().__init__(is_collect)
        self.views: list[DataProto] = []

    def train_mode(self):
        return nullcontext()

    def forward_backward(self, batch: DataProto, loss_fn=None, forward_only: bool = False):
        self.views.append(batch)
        outputs, _ = super().forward_backward(batch)
        shape = batch.batch["input_ids"].shape
        ctx = LossContext(global_num_tokens=int(batch.batch["response_mask"].sum()), global_num_seqs=shape[0],
                          dp_size=1, num_micro_batches=1, micro_batch_index=0)
        _, metrics = loss_fn({"log_probs": -torch.ones(shape), "entropy": torch.ones(shape)}, batch, ctx)
        return outputs, {**metrics, "loss": 0.0}


def policy_config(entropy_coeff: float = 0.0) -> SimpleNamespace:
    """The actor config keys the policy loss reads (vanilla PPO, token-mean)."""
    return SimpleNamespace(
        policy_loss=SimpleNamespace(loss_mode="vanilla"), loss_agg_mode="token-mean", clip_ratio=0.2,
        clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0, entropy_coeff=entropy_coeff, use_kl_loss=False,
    )
