"""The training client's JSON requests besides ``forward_backward``: optimizer steps and checkpoints.

Each ``*_job`` reads its request body, checks it (a ``UserError`` is answered 4xx before anything is
queued) and returns the ``prepare`` callable ``TinkerService.submit`` wants: it builds the job that
runs on the client's host, in the client's ``seq_id`` order.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from rlflow.engines.config import StepHyperparams
from rlflow.errors import UserError
from rlflow.service.checkpoint_store import CheckpointStore, check_ttl
from rlflow.service.futures import Payload
from rlflow.service.service import Client, InflightWeights, Sampler, TinkerService, session_of

Prepare = Callable[[Client], Callable[[], Payload]]


def optim_step_job(body: dict[str, Any]) -> Prepare:
    """``optim_step`` with ``adam_params`` (learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm)."""
    adam = body.get("adam_params")
    if adam is None:
        raise UserError(f"optim_step: only AdamW steps (adam_params) are supported, got {sorted(body)}")
    lr = float(adam.get("learning_rate", 1e-4))
    hyperparams = StepHyperparams(betas=(float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95))),
                                  eps=float(adam.get("eps", 1e-12)), weight_decay=float(adam.get("weight_decay", 0.0)),
                                  grad_clip=float(adam.get("grad_clip_norm", 0.0)))

    def prepare(client: Client) -> Callable[[], Payload]:
        return lambda: {"metrics": client.host.optim_step(client.model, lr, hyperparams), "type": "optim_step"}

    return prepare


def _expire(service: TinkerService, client: Client, kind: str, name: str, ttl_seconds: Optional[int]) -> None:
    """Give the checkpoint just saved the TTL its request asked for (None: it never expires)."""
    if ttl_seconds is not None:
        CheckpointStore(service.folders).set_ttl(client.model.model_id, kind, name, client.account, ttl_seconds)


def save_weights_job(service: TinkerService, body: dict[str, Any]) -> Prepare:
    """``save_state``: the client's adapters and optimizer state as ``tinker://<model>/weights/<name>``."""

    def prepare(client: Client) -> Callable[[], Payload]:
        model_id, name, ttl = client.model.model_id, str(body.get("path")), body.get("ttl_seconds")
        folder = service.folders.folder(model_id, "weights", name)
        if folder.exists() and not body.get("overwrite", False):
            raise UserError(f"save_state: {service.folders.path(model_id, 'weights', name)} exists; pick another name or overwrite")
        check_ttl(ttl)

        def job() -> Payload:
            client.host.save_state(client.model, folder)
            _expire(service, client, "weights", name, ttl)
            return {"path": service.folders.path(model_id, "weights", name), "type": "save_weights"}

        return job

    return prepare


def load_weights_job(service: TinkerService, body: dict[str, Any], account: str) -> Prepare:
    """``load_state`` (``_with_optimizer``): replace the client's weights with a saved state's of ``account``, of the
    same base model and LoRA shape, and its optimizer state with the saved one if ``optimizer`` is set, else with a
    new optimizer's."""
    path = str(body.get("path"))
    source_id, folder = service.folders.resolve(path, "weights", account)
    source = service.folders.read_record(source_id)

    def prepare(client: Client) -> Callable[[], Payload]:
        if source != (client.model.base_model, client.model.shape):
            raise UserError(f"load_state: {path} holds {source[0]} with LoRA {source[1]}, and model {client.model.model_id} "
                            f"is {client.model.base_model} with LoRA {client.model.shape}")

        def job() -> Payload:
            client.host.load_state(client.model, folder, bool(body.get("optimizer")))
            return {"path": path, "model_id": client.model.model_id, "type": "load_weights"}

        return job

    return prepare


def save_sampler_job(service: TinkerService, body: dict[str, Any]) -> Prepare:
    """``save_weights_for_sampler``: the adapters as a peft folder, loaded into the sampler at once.

    Named (``path``): ``tinker://<model>/sampler_weights/<name>``. Unnamed (``save_weights_and_get_sampling_client``,
    ``sampling_session_seq_id`` k): a sampling session ``<session>:sample:<k>`` over those weights; with
    ``kind: inflight`` the session samples with whatever the client saves for inflight sampling last, as do its
    earlier inflight sessions once this save has run (the SDK's inflight contract)."""

    def prepare(client: Client) -> Callable[[], Payload]:
        model_id = client.model.model_id
        name = body.get("path")
        seq = body.get("sampling_session_seq_id")
        if name is None and seq is None:
            raise UserError("save_weights_for_sampler needs a path (a name) or a sampling_session_seq_id")
        name = str(name) if name is not None else f"session-{int(seq)}"
        folder = service.folders.folder(model_id, "sampler_weights", name)
        path = service.folders.path(model_id, "sampler_weights", name)

        ttl = body.get("ttl_seconds")
        check_ttl(ttl)
        inflight = body.get("kind") == "inflight"
        result: dict[str, Any] = {"path": path, "type": "save_weights_for_sampler"}
        shared = service.inflight.setdefault(model_id, InflightWeights(str(folder))) if inflight else None
        if seq is not None:  # the session is usable once this job has run, which is when the client learns its id
            result["sampling_session_id"] = f"{session_of(model_id)}:sample:{int(seq)}"
            service.samplers[result["sampling_session_id"]] = Sampler(client.host, str(folder), client.requested_base, path,
                                                                  client.account, shared)

        def job() -> Payload:
            client.host.save_sampler(client.model, folder)
            _expire(service, client, "sampler_weights", name, ttl)
            if shared is not None:
                shared.folder = str(folder)  # every inflight session of this client samples these from now on
            return result

        return job

    return prepare
