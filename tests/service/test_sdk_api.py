"""The rest of the Tinker API through the real SDK, on the fsdp2 server of ``conftest.services``: every built-in loss
and a custom loss (run on the server from ``create_custom_loss``, and on the client) each train like its formula
in plain peft + ``torch.optim.AdamW``; ``create_training_client_from_state_with_optimizer`` resumes the Adam
moments and ``create_training_client_from_state`` a new optimizer; ``get_server_capabilities`` lists the served
models; a rank-0 client fine-tunes every weight.
"""

from __future__ import annotations

import pytest
import tinker
import torch
from sdk_clients import ARITHMETIC, nll, peft_adamw_run, sft_data
from sdk_servers import RANK, assert_adapters_equal, check_full_fine_tuning, saved_adapters, sdk_client, sdk_service
from loss_references import token_losses
from service_runner import API_KEY
from tinker import types

from rlflow.service.losses import loss_config  # the defaults the formulas need where a config is partial

# eps 1e-3, as in test_sdk.py: Adam turns a gradient of about eps into a step of about lr, so float noise in
# near-zero gradients would otherwise move single weights
ADAM = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-3)
# each built-in loss with a config that makes its clip or penalty take effect on the data below
LOSS_CONFIGS = {"cross_entropy": None, "importance_sampling": None, "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
                "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 1.05}, "dro": {"beta": 0.5},
                "gspo": {"clip_low_threshold": 0.95, "clip_high_threshold": 1.05}}


PROMPT_POSITIONS = 3  # the first positions are the prompt's: target 0 and advantage 0, as tinker-cookbook's rl_loop


def _rl_data(client, generator: torch.Generator) -> list[types.Datum]:
    """The arithmetic texts as RL data: sampler log-probs within 0.3 of the client's own, random advantages and
    weights, gspo's mask on every target but the first, and the cookbook's prompt positions (targets that are
    not the next tokens)."""
    data = sft_data(client.get_tokenizer(), ARITHMETIC[:4])
    forward = client.forward(data, "cross_entropy").result()
    rl = []
    for datum, output in zip(data, forward.loss_fn_outputs):
        own = torch.tensor(output["logprobs"].tolist())
        n = len(own)
        prompt = torch.arange(n) < PROMPT_POSITIONS
        targets = torch.tensor(datum.loss_fn_inputs["target_tokens"].tolist()).masked_fill(prompt, 0)
        rl.append(types.Datum(model_input=datum.model_input, loss_fn_inputs={
            "target_tokens": targets.tolist(),
            "logprobs": (own + (torch.rand(n, generator=generator) - 0.5) * 0.6).masked_fill(prompt, 0.0).tolist(),
            "advantages": torch.randn(n, generator=generator).masked_fill(prompt, 0.0).tolist(),
            "weights": torch.rand(n, generator=generator).tolist(),
            "sequence_ratio_mask": [0.0] + [1.0] * (n - 1)}))
    return rl


def _column(datum: types.Datum, name: str) -> torch.Tensor:
    return torch.tensor(datum.loss_fn_inputs[name].tolist(), dtype=torch.float32)


def _formula(name: str, config: dict):
    """Loss ``name``'s sum over a datum, from the formulas of ``loss_references.py``."""
    def datum_loss(logprobs: torch.Tensor, datum: types.Datum) -> torch.Tensor:
        inputs = [_column(datum, key)[None] for key in ("logprobs", "advantages", "weights", "sequence_ratio_mask")]
        q, adv, w, marked = inputs
        return token_losses(name, logprobs[None], q, adv, w, config, marked).sum()
    return datum_loss


def test_each_builtin_loss_trains_like_its_formula_in_plain_peft(services, tiny_model):
    """One client takes a step with each built-in loss in turn; its adapters after the 6 steps, and each step's
    ``loss:sum``, equal plain peft + AdamW stepping on each loss's published formula."""
    server = services("fsdp2")
    _, client = sdk_client(server)
    start = client.save_weights_for_sampler("start").result().path
    data = _rl_data(client, torch.Generator().manual_seed(0))
    losses = []
    for name, config in LOSS_CONFIGS.items():
        losses.append(client.forward_backward(data, name, config).result().metrics["loss:sum"])
        client.optim_step(ADAM).result()
    formulas = [_formula(name, loss_config(name, config)) for name, config in LOSS_CONFIGS.items()]
    expected, expected_losses = peft_adamw_run(tiny_model, server.checkpoint_folder(start), data, ADAM, formulas)
    assert losses == pytest.approx(expected_losses, rel=1e-4, abs=1e-4)
    assert_adapters_equal(saved_adapters(server, client.save_weights_for_sampler("end").result().path), expected)


def clipped_ratio(logprobs, sampled, advantages):
    """A per-datum custom loss: PPO's clipped surrogate at 0.9 / 1.1, reading its sampler log-probs from a
    ``loss_fn_inputs`` key of its own."""
    ratio = torch.exp(logprobs - sampled)
    loss = -torch.minimum(ratio * advantages, ratio.clamp(0.9, 1.1) * advantages).sum()
    return loss, {"custom/ratio:mean": ratio.mean()}


def _clipped_ratio_of(logprobs: torch.Tensor, datum: types.Datum) -> torch.Tensor:
    return clipped_ratio(logprobs, _column(datum, "sampled"), _column(datum, "advantages"))[0]


def test_a_custom_loss_trains_like_plain_peft_on_the_server_and_on_the_client(services, tiny_model):
    """``create_custom_loss`` uploads the loss (the server asks for that) and ``forward_backward_custom`` runs it
    on the server; a plain callable runs on the client over ``forward``. Both clients end a step with the adapters
    of plain peft + AdamW on the same function, and the server reports the loss's own metric."""
    server = services("fsdp2")
    service, uploaded = sdk_client(server)
    handle = service.create_custom_loss(clipped_ratio, {"logprobs": 1, "sampled": 1, "advantages": 1}).result()
    assert handle.loss_id is not None, "the loss was not uploaded: the server's client config asks for that"
    start = uploaded.save_weights_for_sampler("start").result().path
    data = [types.Datum(model_input=datum.model_input, loss_fn_inputs={
        "target_tokens": datum.loss_fn_inputs["target_tokens"], "sampled": datum.loss_fn_inputs["logprobs"],
        "advantages": datum.loss_fn_inputs["advantages"]}) for datum in _rl_data(uploaded, torch.Generator().manual_seed(1))]

    def on_the_client(batch, logprobs_list):
        return sum(_clipped_ratio_of(lp, datum) for datum, lp in zip(batch, logprobs_list)), {}

    before = uploaded.forward(data, "cross_entropy").result().loss_fn_outputs
    ratios = [clipped_ratio(torch.tensor(out["logprobs"].tolist()), _column(datum, "sampled"), _column(datum, "advantages"))
              [1]["custom/ratio:mean"] for datum, out in zip(data, before)]
    result = uploaded.forward_backward_custom(data, handle).result()
    uploaded.optim_step(ADAM).result()
    local = service.create_lora_training_client(base_model="tiny", rank=RANK).result()
    local.forward_backward_custom(data, on_the_client).result()
    local.optim_step(ADAM).result()

    expected, (expected_loss,) = peft_adamw_run(tiny_model, server.checkpoint_folder(start), data, ADAM, [_clipped_ratio_of])
    assert result.metrics["loss:sum"] == pytest.approx(expected_loss, rel=1e-4)
    assert result.metrics["custom/ratio:mean"] == pytest.approx(float(sum(ratios) / len(ratios)), rel=1e-5)
    for client in (uploaded, local):
        assert_adapters_equal(saved_adapters(server, client.save_weights_for_sampler("end").result().path), expected)


def test_a_client_from_state_with_optimizer_resumes_the_adam_moments_and_capabilities_list_the_models(services, tiny_model):
    """``create_training_client_from_state_with_optimizer`` takes the same next step as the client it was saved from
    (the Adam moments came back); ``create_training_client_from_state`` takes a new optimizer's first step from the
    saved weights, as plain peft + AdamW does from them."""
    server = services("fsdp2")
    service, client = sdk_client(server)
    data = sft_data(client.get_tokenizer())
    for _ in range(2):
        client.forward_backward(data, "cross_entropy").result()
        client.optim_step(ADAM).result()
    state = client.save_state("resume").result().path
    weights = client.save_weights_for_sampler("resume").result().path
    resumed = service.create_training_client_from_state_with_optimizer(state).result()
    fresh = service.create_training_client_from_state(state).result()
    for each in (client, resumed, fresh):
        each.forward_backward(data, "cross_entropy").result()
        each.optim_step(ADAM).result()
    after = [saved_adapters(server, each.save_weights_for_sampler("after").result().path) for each in (client, resumed, fresh)]
    assert_adapters_equal(after[1], after[0], atol=1e-6)
    expected, _ = peft_adamw_run(tiny_model, server.checkpoint_folder(weights), data, ADAM, [nll])
    assert_adapters_equal(after[2], expected)

    rest = tinker.RestClient(base_url=server.url, api_key=API_KEY)
    models = {model.model_name: model for model in rest.get_server_capabilities().result().supported_models}
    assert set(models) == {"tiny", "warm"} and models["tiny"].max_context_length == 512


def test_a_rank_0_client_fine_tunes_every_weight_like_plain_hf_and_samples_with_them(services, tiny_model):
    """``create_lora_training_client(rank=0)`` is full fine-tuning (megatron: ``test_own_servers.py``)."""
    server = services("fsdp2")
    check_full_fine_tuning(server, sdk_service(server), tiny_model)
