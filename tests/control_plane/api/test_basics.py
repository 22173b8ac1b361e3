"""Health, problem documents, tokens, roles and the audit log."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from control_plane.services import Services


def test_health_and_ready(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "artifacts": "ok", "tuf_metadata": "ok"}


def test_openapi_lists_the_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/fleets",
        "/v1/fleets/{fleet}/targets",
        "/v1/artifacts/{sha256}",
        "/v1/fleets/{fleet}/models/{model}/versions/{version}/artifact",
        "/v1/fleets/{fleet}/tuf/metadata/{filename}",
        "/v1/tokens",
        "/v1/audit",
    ):
        assert path in paths


def test_first_admin_token_written_once_with_mode_0600(services: Services) -> None:
    path = services.admin_token_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_text()
    assert services.access.bootstrap_admin(path) is False
    assert path.read_text() == first


def test_missing_token_is_a_401_problem(client: TestClient) -> None:
    response = client.get("/v1/fleets", headers={"Authorization": ""})
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == 401
    assert body["title"] == "authentication required"
    assert body["request_id"] == response.headers["x-request-id"]


def test_wrong_token_is_refused(client: TestClient) -> None:
    response = client.get("/v1/fleets", headers={"Authorization": "Bearer eft_nope"})
    assert response.status_code == 401
    assert "unknown API token" in response.json()["detail"]


def test_roles_are_enforced_and_audited(client: TestClient) -> None:
    created = client.post("/v1/tokens", json={"name": "ci-viewer", "role": "viewer"})
    assert created.status_code == 201
    viewer = {"Authorization": f"Bearer {created.json()['token']}"}
    assert client.get("/v1/fleets", headers=viewer).status_code == 200
    refused = client.post("/v1/fleets", json={"name": "parks"}, headers=viewer)
    assert refused.status_code == 403
    assert refused.json()["needed"] == "admin"
    assert refused.json()["actual"] == "viewer"

    # a viewer cannot read the audit log; the admin sees the refusal in it
    assert client.get("/v1/audit", headers=viewer).status_code == 403
    entries = client.get("/v1/audit").json()
    actions = [(e["action"], e["outcome"], e["actor"]) for e in entries]
    assert ("token.create", "ok", "bootstrap-admin") in actions
    assert ("fleet.create", "refused", "ci-viewer") in actions


def test_refused_mutation_is_audited(client: TestClient) -> None:
    client.post("/v1/fleets", json={"name": "parks"})
    again = client.post("/v1/fleets", json={"name": "Bad Name"})
    assert again.status_code == 400
    entries = client.get("/v1/audit", params={"action": "fleet.create"}).json()
    outcomes = sorted(e["outcome"] for e in entries)
    assert outcomes == ["ok", "refused"]
    assert all(e["request_id"] for e in entries)


def test_revoked_token_stops_working(client: TestClient) -> None:
    created = client.post("/v1/tokens", json={"name": "temp", "role": "operator"}).json()
    headers = {"Authorization": f"Bearer {created['token']}"}
    assert client.get("/v1/fleets", headers=headers).status_code == 200
    assert client.delete(f"/v1/tokens/{created['id']}").status_code == 200
    response = client.get("/v1/fleets", headers=headers)
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]


def test_the_last_admin_token_cannot_be_revoked(client: TestClient) -> None:
    me = next(t for t in client.get("/v1/tokens").json() if t["role"] == "admin")
    response = client.delete(f"/v1/tokens/{me['id']}")
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"
    assert "last active admin token" in response.json()["detail"]
    assert client.get("/v1/fleets").status_code == 200  # still works
    refused = client.get("/v1/audit", params={"action": "token.revoke"}).json()
    assert [e["outcome"] for e in refused] == ["refused"]
    # With a second admin token the first may go; then the second is the last one.
    second = client.post("/v1/tokens", json={"name": "admin-2", "role": "admin"}).json()
    assert client.delete(f"/v1/tokens/{me['id']}").status_code == 200
    client.headers["Authorization"] = f"Bearer {second['token']}"
    assert client.delete(f"/v1/tokens/{second['id']}").status_code == 409


def test_token_recover_writes_a_working_admin_token(
    client: TestClient, services: Services, capsys: pytest.CaptureFixture[str]
) -> None:
    from control_plane.cli.main import main

    config = services.config
    # Every admin token is gone (revoked in the database directly, as after an accident).
    from sqlalchemy import update

    from control_plane.storage.db import session_factory
    from control_plane.storage.models import ApiTokenRow

    with session_factory(services.engine).begin() as session:
        session.execute(update(ApiTokenRow).values(revoked_at=services.clock.now()))
    assert client.get("/v1/fleets").status_code == 401
    argv = ["-o", "json", "token", "recover", "--data-dir", str(config.data_dir)]
    assert main([*argv, "--database-url", config.database_url]) == 0
    out = json.loads(capsys.readouterr().out)
    token_file = config.data_dir / "admin-token"
    assert out["token_file"] == str(token_file)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    client.headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
    assert client.get("/v1/fleets").status_code == 200
    audit = client.get("/v1/audit", params={"action": "token.create"}).json()
    assert audit[0]["actor"] == "system"
    assert audit[0]["target"] == "token:recovery-admin"


def test_token_recover_refuses_a_dir_without_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from control_plane.cli.main import main

    monkeypatch.delenv("EDGEFLEET_DATABASE_URL", raising=False)

    assert main(["token", "recover", "--data-dir", str(tmp_path / "nothing")]) == 1
    assert "no database at" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def test_tokens_are_stored_hashed(client: TestClient, services: Services) -> None:
    created = client.post("/v1/tokens", json={"name": "x", "role": "viewer"}).json()
    listed = client.get("/v1/tokens").json()
    assert all("token" not in t for t in listed)
    from sqlalchemy import select

    from control_plane.storage.db import session_factory
    from control_plane.storage.models import ApiTokenRow

    with session_factory(services.engine)() as session:
        stored = list(session.scalars(select(ApiTokenRow.token_hash)))
    assert created["token"] not in stored
    assert len(stored) == 2


def test_unknown_role_is_a_clear_error(client: TestClient) -> None:
    response = client.post("/v1/tokens", json={"name": "x", "role": "superuser"})
    assert response.status_code == 400
    assert "choose one of viewer" in response.json()["detail"]


def test_json_body_over_the_limit_is_413(client: TestClient) -> None:
    response = client.post("/v1/fleets", content=b"{" + b" " * 70_000 + b"}")
    assert response.status_code == 413
    assert response.json()["limit"] == 64 * 1024


def test_malformed_json_is_a_422_problem(client: TestClient) -> None:
    response = client.post(
        "/v1/fleets", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("method", "url", "params", "field"),
    [
        ("GET", "/v1/audit", {"since": "2026-12-01T10:00:00"}, ["query", "since"]),
        ("POST", f"/v1/alerts/{1 << 63}/clear", {}, ["path", "alert_id"]),
        ("POST", f"/v1/alerts/{10**30}/clear", {}, ["path", "alert_id"]),
    ],
)
def test_values_the_database_cannot_take_are_a_422_naming_the_field(
    client: TestClient, method: str, url: str, params: dict[str, str], field: list[str]
) -> None:
    response = client.request(method, url, params=params)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert [e["loc"] for e in response.json()["errors"]] == [field]


def test_a_zoned_since_and_the_largest_int64_id_are_fine(client: TestClient) -> None:
    assert client.get("/v1/audit", params={"since": "2026-12-01T10:00:00+02:00"}).status_code == 200
    assert client.post(f"/v1/alerts/{(1 << 63) - 1}/clear").status_code == 404
