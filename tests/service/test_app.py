"""The HTTP layer around the service: authentication, and how refusals and failures are answered.

The service behind the app is a stand-in here (this is a unit test of the app around it); the live
server with real worker groups is tested through the SDK in test_sdk.py.
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from rlflow.service.app import build_app
from rlflow.service.catalogue import UnknownModelError
from rlflow.service.scheduler import QueueFullError

KEY = "tml-unit"


class BrokenService:
    """Fails the way a bug would, or refuses the way a user error does."""

    catalogue = {"tiny": None}
    max_seq_len = 8
    folders = None  # the REST routes' store is built on it, and not called here

    def create_session(self, account: str) -> str:
        raise RuntimeError("a bug in the service")

    def get_info(self, model_id: str, account: str) -> dict:
        if model_id == "busy":
            raise QueueFullError("get_info: 512 requests wait for this worker group already")
        raise UnknownModelError(f"model {model_id!r} does not exist")


def _client() -> TestClient:
    return TestClient(build_app(BrokenService(), [KEY]))


def test_requests_without_a_valid_key_get_401():
    client = _client()
    assert client.get("/api/v1/healthz").status_code == 401
    assert client.get("/api/v1/healthz", headers={"X-API-Key": "tml-other"}).status_code == 401
    assert client.get("/api/v1/healthz", headers={"X-API-Key": KEY}).json() == {"status": "ok"}


def test_a_server_error_is_a_500_naming_the_request_and_the_server_goes_on():
    client = _client()
    failed = client.post("/api/v1/create_session", json={}, headers={"X-API-Key": KEY})
    assert failed.status_code == 500
    assert failed.json()["detail"] == "POST /api/v1/create_session failed: RuntimeError: a bug in the service"
    assert client.get("/api/v1/healthz", headers={"X-API-Key": KEY}).status_code == 200


def test_bad_bodies_and_unknown_models_get_a_4xx_with_one_line():
    client = _client()
    not_json = client.post("/api/v1/get_info", content=b"{not json", headers={"X-API-Key": KEY})
    assert not_json.status_code == 400 and "the body is not JSON" in not_json.json()["detail"]
    unknown = client.post("/api/v1/get_info", json={"model_id": "m"}, headers={"X-API-Key": KEY})
    assert unknown.status_code == 404 and unknown.json()["detail"] == "model 'm' does not exist"


def test_a_full_queue_is_a_429_which_the_sdk_backs_off_from_and_resends():
    full = _client().post("/api/v1/get_info", json={"model_id": "busy"}, headers={"X-API-Key": KEY})
    assert full.status_code == 429
    assert full.json()["detail"] == "get_info: 512 requests wait for this worker group already"
