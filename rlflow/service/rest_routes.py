"""The REST client's routes (``tinker.RestClient``): training runs and their checkpoints, on ``CheckpointStore``, and
the sessions of the running service.

Each route acts for the request's account (``request.state.account``, set by the app's authentication). A
checkpoint is named in the URL as the SDK sends it: ``<run id>/checkpoints/<weights|sampler_weights>/<name>``.
Sessions live in the service's memory: a restarted service lists only its own.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from rlflow.service.catalogue import UnknownModelError
from rlflow.service.checkpoint_store import CheckpointStore
from rlflow.service.service import TinkerService, session_of

API = "/api/v1"
CHECKPOINT = f"{API}/training_runs/{{run_id}}/checkpoints/{{kind}}/{{name}}"


def _page(items: list[Any], offset: int, limit: int) -> tuple[list[Any], dict[str, int]]:
    return items[offset:offset + limit], {"offset": offset, "limit": limit, "total_count": len(items)}


def add_rest_routes(app: FastAPI, store: CheckpointStore, service: TinkerService) -> None:
    """Serve the REST client's training-run and checkpoint operations from ``store``, and its session operations
    from ``service``."""

    @app.get(f"{API}/sessions")
    async def list_sessions(request: Request, limit: int = 20, offset: int = 0) -> dict:
        owned = [session_id for session_id, account in service.sessions.items() if account == request.state.account]
        return {"sessions": owned[::-1][offset:offset + limit]}  # newest first

    @app.get(f"{API}/sessions/{{session_id}}")
    async def get_session(session_id: str, request: Request) -> dict:
        if service.sessions.get(session_id) != request.state.account:
            raise UnknownModelError(f"session {session_id!r} does not exist")
        return {"training_run_ids": [model_id for model_id in service.clients if session_of(model_id) == session_id],
                "sampler_ids": [sampler_id for sampler_id in service.samplers if sampler_id.startswith(f"{session_id}:sample:")]}

    @app.get(f"{API}/training_runs")
    async def list_training_runs(request: Request, limit: int = 20, offset: int = 0) -> dict:
        page, cursor = _page(store.run_ids(request.state.account), offset, limit)
        return {"training_runs": [store.training_run(run_id, request.state.account) for run_id in page], "cursor": cursor}

    @app.get(f"{API}/training_runs/{{run_id}}")
    async def get_training_run(run_id: str, request: Request) -> dict:
        return store.training_run(run_id, request.state.account)

    @app.get(f"{API}/training_runs/{{run_id}}/checkpoints")
    async def list_checkpoints(run_id: str, request: Request) -> dict:
        return {"checkpoints": [checkpoint.as_json(store.folders)
                                for checkpoint in store.checkpoints(run_id, request.state.account)]}

    @app.get(f"{API}/checkpoints")
    async def list_user_checkpoints(request: Request, limit: int = 100, offset: int = 0) -> dict:
        account = request.state.account
        every = [checkpoint for run_id in store.run_ids(account) for checkpoint in store.checkpoints(run_id, account)]
        page, cursor = _page(every, offset, limit)
        return {"checkpoints": [checkpoint.as_json(store.folders) for checkpoint in page], "cursor": cursor}

    @app.delete(CHECKPOINT)
    async def delete_checkpoint(run_id: str, kind: str, name: str, request: Request) -> dict:
        store.delete(run_id, kind, name, request.state.account)
        return {}

    @app.post(f"{CHECKPOINT}/publish")
    async def publish(run_id: str, kind: str, name: str, request: Request) -> dict:
        store.set_public(run_id, kind, name, request.state.account, public=True)
        return {}

    @app.delete(f"{CHECKPOINT}/publish")
    async def unpublish(run_id: str, kind: str, name: str, request: Request) -> dict:
        store.set_public(run_id, kind, name, request.state.account, public=False)
        return {}

    @app.put(f"{CHECKPOINT}/ttl")
    async def set_ttl(run_id: str, kind: str, name: str, request: Request) -> dict:
        body = await request.json()
        store.set_ttl(run_id, kind, name, request.state.account, body.get("ttl_seconds") if isinstance(body, dict) else None)
        return {}
