"""The HTTP face of the service: the Tinker API routes (``/api/v1/...``) the ``tinker`` SDK calls.

Every request needs an ``X-API-Key`` from ``service.api_keys`` (401 otherwise), and acts for that key's account
(``rlflow.service.accounts``): another account's sessions, models, samplers, paths and futures are 404. A request the
service refuses gets a 4xx with ``{"detail": <one line>}``: 404 for an unknown model, session or
path, 429 for a full queue (the SDK backs off and resends it), 400 for the rest (a malformed body, bad data, a
sequence too long, a ``seq_id`` gap). No refusal of a request that cannot succeed later is a 409 or 402, which the
SDK would retry for minutes. An unexpected error is a 500
naming the request, and the server goes on serving. Long-running work answers with a future
(``{"request_id": ...}``) that the client polls with ``retrieve_future``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from rlflow.errors import UserError
from rlflow.service.accounts import account_of_key
from rlflow.service.catalogue import UnknownModelError
from rlflow.service.checkpoint_store import CheckpointStore
from rlflow.service.futures import UnknownFutureError
from rlflow.service.rest_routes import add_rest_routes
from rlflow.service.requests import load_weights_job, optim_step_job, save_sampler_job, save_weights_job
from rlflow.service.sampling import SamplingRequest
from rlflow.service.scheduler import QueueFullError
from rlflow.service.service import TinkerService
from rlflow.service.wire import MalformedBodyError, decode_forward_backward
from rlflow.utils.logging import get_logger

logger = get_logger(__name__)
API = "/api/v1"
# The client configuration this server asks the SDK for: plain requests in seq_id order, no JWT exchange,
# server-side custom losses (rlflow.service.custom_losses), no batched future retrieval.
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "use_pyqwest_transport": False,
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": True,
    "sample_join_sampling_session": False,
}


def _status(error: UserError) -> int:
    """404 for what does not exist (to this account), 429 for a full queue (the SDK backs off and sends the request
    again: it kept its ``seq_id``), 400 for the rest."""
    if isinstance(error, QueueFullError):
        return 429
    return 404 if isinstance(error, (UnknownModelError, UnknownFutureError)) else 400


async def _json(request: Request) -> dict[str, Any]:
    """The request's JSON object body; ``MalformedBodyError`` (400) when it is not one."""
    try:
        body = json.loads(await request.body())
    except ValueError as error:
        raise MalformedBodyError(f"{request.url.path}: the body is not JSON ({error})") from None
    if not isinstance(body, dict):
        raise MalformedBodyError(f"{request.url.path}: the body is not a JSON object")
    return body


def _future(request_id: str, **extra: Any) -> dict[str, Any]:
    return {"request_id": request_id, **extra}


def build_app(service: TinkerService, api_keys: list[str]) -> FastAPI:
    """The FastAPI app serving ``service`` to clients holding one of ``api_keys``."""
    app = FastAPI(title="rlflow Tinker service", docs_url=None, redoc_url=None)
    keys = frozenset(api_keys)

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Response:
        key = request.headers.get("x-api-key")
        if key not in keys:
            return JSONResponse({"detail": "missing or unknown X-API-Key (the server's service.api_keys)"}, status_code=401)
        request.state.account = account_of_key(key)
        try:
            return await call_next(request)
        except UserError as error:
            return JSONResponse({"detail": str(error)}, status_code=_status(error))
        except Exception as error:  # noqa: BLE001 - any failure of one request is answered, and the server goes on
            logger.exception("%s %s failed", request.method, request.url.path)
            return JSONResponse({"detail": f"{request.method} {request.url.path} failed: {type(error).__name__}: {error}"},
                                status_code=500)

    # ---------------------------------------------------------------- session-level
    @app.post(f"{API}/client/config")
    async def client_config() -> dict:
        return CLIENT_CONFIG

    @app.post(f"{API}/client/dynamic_config")
    async def dynamic_config() -> dict:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.post(f"{API}/create_session")
    async def create_session(request: Request) -> dict:
        return {"type": "create_session", "session_id": service.create_session(request.state.account)}

    @app.post(f"{API}/session_heartbeat")
    async def heartbeat() -> dict:
        return {"type": "session_heartbeat"}

    @app.post(f"{API}/sessions/{{session_id}}/finish")
    async def finish_session(session_id: str) -> dict:
        return {}

    @app.post(f"{API}/telemetry")
    async def telemetry() -> dict:
        return {"status": "accepted"}

    @app.get(f"{API}/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get(f"{API}/get_server_capabilities")
    async def capabilities() -> dict:
        return {"supported_models": [{"model_name": name, "max_context_length": service.max_seq_len, "trainable": True,
                                      "sampleable": True} for name in service.catalogue]}

    @app.post(f"{API}/create_custom_loss")
    async def create_custom_loss(request: Request) -> dict:
        return _future(service.create_custom_loss(await _json(request), request.state.account))

    # ---------------------------------------------------------------- training clients
    @app.post(f"{API}/create_model")
    async def create_model(request: Request) -> dict:
        body = await _json(request)
        request_id, model_id = service.create_model(body, request.state.account)
        return _future(request_id, model_id=model_id)

    @app.post(f"{API}/get_info")
    async def get_info(request: Request) -> dict:
        return service.get_info(str((await _json(request)).get("model_id")), request.state.account)

    @app.post(f"{API}/forward_backward")
    async def forward_backward(request: Request) -> dict:
        call = decode_forward_backward(await request.body())
        label = "forward" if call.forward_only else "forward_backward"
        request_id = await service.submit(call.model_id, request.state.account, call.seq_id, label,
                                          service.forward_backward_job(call), accumulates=not call.forward_only)
        return _future(request_id, model_id=call.model_id)

    @app.post(f"{API}/optim_step")
    async def optim_step(request: Request) -> dict:
        body = await _json(request)
        model_id = str(body.get("model_id"))
        request_id = await service.submit(model_id, request.state.account, body.get("seq_id"), "optim_step",
                                          optim_step_job(body), steps=True)
        return _future(request_id, model_id=model_id)

    @app.post(f"{API}/save_weights")
    async def save_weights(request: Request) -> dict:
        body = await _json(request)
        model_id = str(body.get("model_id"))
        return _future(await service.submit(model_id, request.state.account, body.get("seq_id"), "save_state",
                                            save_weights_job(service, body)), model_id=model_id)

    @app.post(f"{API}/load_weights")
    async def load_weights(request: Request) -> dict:
        body = await _json(request)
        if body.get("model_id") is None:  # create_training_client_from_state
            return _future(service.create_model_from_state(body, request.state.account))
        model_id = str(body["model_id"])
        return _future(await service.submit(model_id, request.state.account, body.get("seq_id"), "load_state",
                                            load_weights_job(service, body, request.state.account)), model_id=model_id)

    @app.post(f"{API}/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> dict:
        body = await _json(request)
        model_id = str(body.get("model_id"))
        prepare = save_sampler_job(service, body)
        return _future(await service.submit(model_id, request.state.account, body.get("seq_id"), "save_weights_for_sampler",
                                            prepare), model_id=model_id)

    @app.post(f"{API}/weights_info")
    async def weights_info(request: Request) -> dict:
        path = str((await _json(request)).get("tinker_path"))
        kind = "sampler_weights" if "/sampler_weights/" in path else "weights"
        base_model, shape = service.folders.read_record(service.folders.resolve(path, kind, request.state.account)[0])
        return {"base_model": base_model, "is_lora": shape.is_lora, "lora_rank": shape.rank}

    # ---------------------------------------------------------------- sampling
    @app.post(f"{API}/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict:
        sampling_session_id = service.create_sampling_session(await _json(request), request.state.account)
        return {"type": "create_sampling_session", "sampling_session_id": sampling_session_id}

    @app.get(f"{API}/samplers/{{sampling_session_id}}")
    async def get_sampler(sampling_session_id: str, request: Request) -> dict:
        sampler = service.sampler(sampling_session_id, request.state.account)
        return {"sampler_id": sampling_session_id, "base_model": sampler.base_model, "model_path": sampler.model_path}

    @app.post(f"{API}/asample")
    async def asample(request: Request) -> dict:
        request_id, sample_ids = service.sample(SamplingRequest.from_body(await _json(request)), request.state.account)
        return _future(request_id, sample_sequence_ids=sample_ids)

    add_rest_routes(app, CheckpointStore(service.folders), service)

    # ---------------------------------------------------------------- futures
    @app.post(f"{API}/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        request_id = str((await _json(request)).get("request_id"))
        outcome = await service.retrieve(request_id, request.state.account)
        if outcome is None:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        answer = outcome.as_json()
        if isinstance(answer, tuple):
            content_type, data = answer
            return Response(content=data, media_type=content_type)
        return JSONResponse(answer)

    return app

