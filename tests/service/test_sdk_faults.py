"""The service's answers to bad requests, failing requests and a killed worker, through the real SDK and plain HTTP.

Last of the SDK test modules (they share one server per engine, ``conftest.services``): the killed worker's group
is gone afterwards, and the next client starts a new one.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import tinker
from sdk_clients import sft_data
from sdk_servers import RANK, post, sdk_service
from tinker import types


def test_bad_requests_get_a_4xx_with_one_line_and_the_client_goes_on(services):
    server = services("fsdp2")
    assert post(server, "create_session", key=None, json={}).status_code == 401
    assert post(server, "create_session", key="tml-wrong", json={}).status_code == 401
    with pytest.raises(tinker.AuthenticationError):
        sdk_service(server, api_key="tml-wrong").create_lora_training_client(
            base_model="tiny", rank=RANK).result()

    malformed = post(server, "forward_backward", content=b"\xff\x00garbage", headers={"Content-Type": "application/x-protobuf"})
    assert malformed.status_code == 400 and "not a ForwardBackwardRequest protobuf" in malformed.json()["detail"]
    service = sdk_service(server)
    with pytest.raises(tinker.NotFoundError, match="base model 'nope' is not served"):
        service.create_lora_training_client(base_model="nope", rank=RANK).result()

    client = service.create_lora_training_client(base_model="tiny", rank=RANK).result()
    too_long = [types.Datum(model_input=types.ModelInput.from_ints([5] * 600),
                            loss_fn_inputs={"target_tokens": [5] * 600, "weights": [1.0] * 600})]
    with pytest.raises(tinker.BadRequestError, match="exceed the model's context of 512 tokens"):
        client.forward_backward(too_long, "cross_entropy").result()
    data = sft_data(client.get_tokenizer())
    assert client.forward_backward(data, "cross_entropy").result().metrics["loss:sum"] > 0  # the refused seq_id was skipped
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()  # uses the gradients up: other clients' turn

    model_id = client.model_id
    unknown = post(server, "optim_step", json={"model_id": "nope:train:0", "seq_id": 1, "adam_params": {}})
    assert unknown.status_code == 404 and "does not exist" in unknown.json()["detail"]
    gap = post(server, "optim_step", json={"model_id": model_id, "seq_id": 50, "adam_params": {}})
    assert gap.status_code == 400 and "never did" in gap.json()["detail"]


def test_a_failing_request_is_an_error_future_naming_it_and_the_server_keeps_serving(services):
    server = services("fsdp2")
    client = sdk_service(server).create_lora_training_client(
        base_model="tiny", rank=RANK).result()
    data = sft_data(client.get_tokenizer())
    with pytest.raises(tinker.RequestFailedError, match=r"forward_backward \(model .*seq_id 1\) failed on the server.*on purpose"):
        client.forward_backward(data, "test_raises").result()
    assert client.forward_backward(data, "cross_entropy").result().metrics["loss:sum"] > 0
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()  # uses the gradients up: other clients' turn


def test_killing_a_worker_mid_request_gives_an_error_future_not_a_hang(services):
    """Last of the SDK tests: the killed worker's host is gone (its clients get errors), and a new client starts a new one."""
    server = services("fsdp2")
    service = sdk_service(server)
    client = service.create_lora_training_client(base_model="tiny", rank=RANK).result()
    data = sft_data(client.get_tokenizer())
    server.pid_file.unlink(missing_ok=True)
    future = client.forward_backward(data, "test_sleeps", loss_fn_config={"seconds": 120.0})
    deadline = time.monotonic() + 60
    while not server.pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(int(server.pid_file.read_text()), signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(tinker.RequestFailedError, match="WorkerDiedError"):
        future.result(timeout=90)
    assert time.monotonic() - started < 90
    replacement = service.create_lora_training_client(base_model="tiny", rank=RANK).result()
    assert replacement.forward_backward(data, "cross_entropy").result().metrics["loss:sum"] > 0
