"""Node tokens, enrollment and the inventory over REST (both databases)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.errors import PermissionDeniedError
from control_plane.services import Services
from tests.control_plane.identity.helpers import make_csr


@pytest.fixture
def fleet(client: TestClient) -> str:
    assert client.post("/v1/fleets", json={"name": "gates"}).status_code == 201
    return "gates"


@pytest.fixture
def anonymous(client: TestClient) -> TestClient:
    """A client without an API token, as a node enrolling over REST is."""
    return TestClient(client.app)


def new_token(client: TestClient, fleet: str, **body: Any) -> dict[str, Any]:
    response = client.post(f"/v1/fleets/{fleet}/node-tokens", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def enroll(anonymous: TestClient, token: str, csr: bytes | None = None) -> Any:
    return anonymous.post(
        "/v1/enroll",
        json={
            "token": token,
            "csr_pem": (csr or make_csr()).decode(),
            "agent_version": "0.1.0",
            "transport": "mqtt",
        },
    )


def test_token_enroll_list_label_revoke(
    client: TestClient, anonymous: TestClient, fleet: str, services: Services
) -> None:
    created = new_token(client, fleet, labels={"site": "a", "role": "gate"}, ttl_s=1800)
    assert created["token"].startswith("efb_")
    assert created["labels"] == {"site": "a", "role": "gate"}
    assert created["state"] == "active"

    response = enroll(anonymous, created["token"])
    assert response.status_code == 201, response.text
    enrolled = response.json()
    node_id = enrolled["node_id"]
    assert enrolled["fleet"] == fleet
    assert enrolled["ca_pem"] == services.ca.ca_pem.decode()
    identity = services.ca.node_identity_from_certificate(
        enrolled["certificate_pem"].encode(), now=services.clock.now()
    )
    assert identity.node_id == node_id

    listed = client.get("/v1/nodes", params={"selector": "site=a,role!=door"}).json()
    assert [n["id"] for n in listed] == [node_id]
    assert listed[0]["transport"] == "mqtt"
    assert listed[0]["revoked"] is False
    assert client.get("/v1/nodes", params={"selector": "site=b"}).json() == []
    assert [n["id"] for n in client.get("/v1/nodes", params={"fleet": fleet}).json()] == [node_id]

    shown = client.get(f"/v1/nodes/{node_id}").json()
    assert shown["cert_serial"] == enrolled["cert_serial"]

    patched = client.patch(f"/v1/nodes/{node_id}", json={"labels": {"site": "b", "role": None}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["labels"] == {"site": "b"}
    replaced = client.patch(
        f"/v1/nodes/{node_id}", json={"labels": {"zone": "z", "gone": None}, "replace": True}
    )
    assert replaced.json()["labels"] == {"zone": "z"}
    [last, first] = client.get("/v1/audit", params={"action": "node.labels"}).json()
    assert first["details"]["after"] == {"site": "b"}
    assert last["details"] == {"before": {"site": "b"}, "after": {"zone": "z"}}

    services.nodes.authentication.authorize(node_id, enrolled["cert_serial"])
    revoked = client.post(f"/v1/nodes/{node_id}/revoke")
    assert revoked.status_code == 200
    assert revoked.json()["revoked"] is True
    with pytest.raises(PermissionDeniedError):
        services.nodes.authentication.authorize(node_id, enrolled["cert_serial"])

    tokens = client.get("/v1/node-tokens").json()
    assert [(t["id"], t["state"], t["node_id"]) for t in tokens] == [
        (created["id"], "used", node_id)
    ]
    assert "token" not in tokens[0]


def test_enrollment_refusals_are_problem_documents(
    client: TestClient, anonymous: TestClient, fleet: str, services: Services
) -> None:
    token = new_token(client, fleet)["token"]

    garbage = enroll(anonymous, token, b"-----BEGIN CERTIFICATE REQUEST-----\nnope\n")
    assert garbage.status_code == 400
    assert garbage.headers["content-type"] == "application/problem+json"
    assert garbage.json()["reason"] == "csr-malformed"

    assert enroll(anonymous, token).status_code == 201
    reused = enroll(anonymous, token)
    assert reused.status_code == 401
    assert reused.json()["reason"] == "token-used"
    assert token not in reused.text

    unknown = enroll(anonymous, "efb_made-up")
    assert (unknown.status_code, unknown.json()["reason"]) == (401, "token-unknown")
    assert anonymous.post("/v1/enroll", json={"csr_pem": "x"}).status_code == 422
    assert services.nodes.refusals.snapshot() == {
        "csr-malformed": 1,
        "token-used": 1,
        "token-unknown": 1,
    }


def test_revoked_token_over_rest(client: TestClient, anonymous: TestClient, fleet: str) -> None:
    created = new_token(client, fleet)
    revoked = client.post(f"/v1/node-tokens/{created['id']}/revoke")
    assert revoked.json()["state"] == "revoked"
    assert enroll(anonymous, created["token"]).json()["reason"] == "token-revoked"


def test_viewers_may_read_but_not_create_tokens_or_change_nodes(
    client: TestClient, fleet: str
) -> None:
    viewer = client.post("/v1/tokens", json={"name": "dash", "role": "viewer"}).json()["token"]
    as_viewer = {"Authorization": f"Bearer {viewer}"}

    refused = client.post(f"/v1/fleets/{fleet}/node-tokens", json={}, headers=as_viewer)
    assert refused.status_code == 403
    assert "needs role operator" in refused.json()["detail"]
    assert client.get("/v1/nodes", headers=as_viewer).status_code == 200
    assert client.get("/v1/node-tokens", headers=as_viewer).status_code == 403
    assert client.post("/v1/nodes/n-000000000000/revoke", headers=as_viewer).status_code == 403
    assert client.get("/v1/nodes", headers={"Authorization": ""}).status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/v1/nodes/n-000000000000", None, 404),
        ("PATCH", "/v1/nodes/n-000000000000", {"labels": {"a": "b"}}, 404),
        ("POST", "/v1/nodes/n-000000000000/revoke", None, 404),
        ("GET", "/v1/nodes?selector=site%3D", None, 400),
        ("GET", "/v1/nodes?fleet=nowhere", None, 404),
        ("POST", "/v1/fleets/nowhere/node-tokens", {}, 404),
        ("POST", "/v1/fleets/gates/node-tokens", {"ttl_s": 10}, 400),
        ("POST", "/v1/fleets/gates/node-tokens", {"ttl_s": 10**12}, 422),
        ("POST", "/v1/fleets/gates/node-tokens", {"labels": {"a b": "c"}}, 400),
        ("POST", "/v1/node-tokens/nope/revoke", None, 404),
    ],
)
def test_bad_requests(
    client: TestClient, fleet: str, method: str, path: str, body: Any, status: int
) -> None:
    response = client.request(method, path, json=body)
    assert response.status_code == status, response.text
