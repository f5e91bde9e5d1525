"""SDK clients of the live servers (``conftest.services``: one ``python -m rlflow.service`` per engine, shared by the
SDK test modules): make them with ``sdk_service`` / ``sdk_client``, so the fixture closes their sessions before the
servers stop; ``post`` sends plain HTTP; the checks that read what a server wrote (adapters, full weights).
"""

from __future__ import annotations

import httpx
import tinker
import torch
from safetensors.torch import load_file
from sdk_clients import ARITHMETIC, nll, peft_adamw_run, sft_data
from service_runner import API_KEY
from tinker import types

RANK = 8
OPEN_SERVICES: list[tinker.ServiceClient] = []  # closed by conftest.services


def sdk_service(server, api_key: str = API_KEY) -> tinker.ServiceClient:
    """An SDK client of ``server``; the ``services`` fixture closes it before the server stops."""
    service = tinker.ServiceClient(base_url=server.url, api_key=api_key)
    OPEN_SERVICES.append(service)
    return service


def sdk_client(server, base_model: str = "tiny", rank: int = RANK) -> tuple[tinker.ServiceClient, tinker.TrainingClient]:
    """An SDK client of ``server`` and a new training client of ``base_model`` (LoRA ``rank``; 0: full fine-tuning)."""
    service = sdk_service(server)
    return service, service.create_lora_training_client(base_model=base_model, rank=rank).result()


def post(server, path: str, key: str | None = API_KEY, headers: dict | None = None, **kwargs) -> httpx.Response:
    """A plain HTTP POST to ``/api/v1/<path>`` of ``server`` with ``key`` (None: no key)."""
    headers = {**(headers or {}), **({"X-API-Key": key} if key else {})}
    return httpx.post(f"{server.url}/api/v1/{path}", headers=headers, timeout=60, **kwargs)


def saved_adapters(server, path: str) -> dict[str, torch.Tensor]:
    """The LoRA weights of the peft folder a ``save_weights_for_sampler`` path of ``server`` names."""
    return load_file(str(server.checkpoint_folder(path) / "adapter_model.safetensors"))


def assert_adapters_equal(trained: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], atol: float = 2e-5) -> None:
    """``trained`` (a peft folder's names) equals ``expected`` (a live peft model's, with ``.default``) within
    ``atol``: measured within 8e-6 after 2 steps, where a wrong or mixed-up step moves weights by ~1e-3."""
    assert {name.replace(".default", "") for name in expected} == set(trained)
    for name, tensor in expected.items():
        torch.testing.assert_close(trained[name.replace(".default", "")], tensor, rtol=0, atol=atol)


def check_full_fine_tuning(server, service: tinker.ServiceClient, tiny_model) -> None:
    """A rank-0 training client of ``server``'s ``tiny``: no adapters (``get_info``), two cross-entropy steps end
    with the weights of the HF model + ``torch.optim.AdamW`` on the same data (within 2e-5; a step moves every
    weight by about the learning rate, 1e-2), and a sampler over the saved weights scores a prompt as the
    training forward does (``compute_logprobs``, within 1e-5)."""
    adam = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-3)
    client = service.create_lora_training_client(base_model="tiny", rank=0).result()
    info = client.get_info()
    assert (info.is_lora, info.lora_rank) == (False, 0)
    data = sft_data(client.get_tokenizer(), ARITHMETIC[:3])
    for _ in range(2):
        client.forward_backward(data, "cross_entropy").result()
        client.optim_step(adam).result()
    expected, _ = peft_adamw_run(tiny_model, None, data, adam, [nll, nll])
    path = client.save_weights_for_sampler("full").result().path
    saved = load_file(str(server.checkpoint_folder(path) / "model.safetensors"))
    assert set(expected) <= set(saved)
    for name, tensor in expected.items():
        torch.testing.assert_close(saved[name], tensor, rtol=0, atol=2e-5)
    forward = client.forward(data[:1], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    scored = service.create_sampling_client(model_path=path).result().compute_logprobs(data[0].model_input).result()
    torch.testing.assert_close(torch.tensor(scored[1:]), torch.tensor(forward[:-1]), rtol=0, atol=1e-5)
