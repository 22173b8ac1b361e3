"""The REST API against its own OpenAPI document: schemathesis, in-process, bounded.

schemathesis's engine runs every operation, stateless, through its coverage phase
(boundary values, each parameter broken in turn) and its fuzzing phase (hypothesis,
positive and negative, a few examples each, fixed seed, derandomized), with the admin
token, on a fresh SQLite data dir holding a fleet with one model and an enrolled node. A
response fails the run if it is a 5xx, or if its status, content type or body is not
what the document declares (problem+json errors included, control_plane.api.openapi).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events

from control_plane.api.app import create_app
from control_plane.cli.client import ApiClient
from control_plane.cli.release import ReleaseClient
from control_plane.registry import sample_models
from control_plane.services import ServiceConfig, Services, build_services
from control_plane.trust.keys import init_operator_keys
from tests.control_plane.identity.helpers import make_csr

FLEET, MODEL, VERSION = "demo", "det", "1.0.0"
EXAMPLES_PER_OPERATION = 10
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
)


class _Api:
    """The app under test, the admin token every generated request carries, and the
    node enrolled for the node routes."""

    def __init__(self, app: FastAPI, token: str, node_id: str, victim_token_id: str) -> None:
        self.app = app
        self.token = token
        self.node_id = node_id
        # The token `DELETE /v1/tokens/{token_id}` revokes: another admin token made by
        # `POST /v1/tokens` could otherwise let the run revoke its own, and every later
        # operation would be checked only as a 401.
        self.victim_token_id = victim_token_id


@pytest.fixture(scope="module")
def api_under_test(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Api]:
    root = tmp_path_factory.mktemp("schemathesis")
    data = root / "server"
    services: Services = build_services(
        ServiceConfig(
            data_dir=data,
            database_url=f"sqlite:///{root / 'edgefleet.db'}",
            artifacts_url=(data / "artifacts").as_uri(),
            max_json_bytes=64 * 1024,
            max_artifact_bytes=1 << 20,
            refresh_interval_s=3600,
        )
    )
    try:
        token = services.admin_token_file.read_text().strip()
        app = create_app(services, run_background=False)
        with TestClient(app) as http:
            _create_fleet_with_a_model(http, token, root)
            node_id = _enroll_a_node(http, token)
            victim = http.post(
                "/v1/tokens",
                json={"name": "schemathesis-victim", "role": "viewer"},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert victim.status_code == 201, victim.text
            yield _Api(app, token, node_id, victim.json()["id"])
    finally:
        services.close()


def _create_fleet_with_a_model(http: TestClient, token: str, root: Path) -> None:
    """Data for the routes to find: the operator CLI's own calls, sent to the app."""

    def relay(request: httpx.Request) -> httpx.Response:
        return http.request(
            request.method,
            request.url.raw_path.decode(),
            headers=request.headers,
            content=request.content,
        )

    keyset = init_operator_keys(root / "keys", root_keys=1, root_threshold=1, passphrase=None)
    with ApiClient("http://testserver", token, transport=httpx.MockTransport(relay)) as api:
        release = ReleaseClient(api, keyset)
        release.create_fleet(FLEET)
        model = sample_models.tiny_detector(root / "det.onnx")
        release.push_model(FLEET, model, name=MODEL, version=VERSION)


def _enroll_a_node(http: TestClient, token: str) -> str:
    auth = {"Authorization": f"Bearer {token}"}
    made = http.post(f"/v1/fleets/{FLEET}/node-tokens", json={}, headers=auth)
    assert made.status_code == 201, made.text
    csr = make_csr().decode()
    enrolled = http.post("/v1/enroll", json={"token": made.json()["token"], "csr_pem": csr})
    assert enrolled.status_code == 201, enrolled.text
    node_id: str = enrolled.json()["node_id"]
    return node_id


def test_every_operation_answers_as_documented(api_under_test: _Api) -> None:
    config = SchemathesisConfig.from_dict(
        {
            "seed": 15,
            "headers": {"Authorization": f"Bearer {api_under_test.token}"},
            # Stateless: the coverage phase (boundary values, each parameter broken in
            # turn: ids beyond int64, times without a zone, missing fields) and the
            # fuzzing phase (hypothesis, positive and negative).
            "phases": {
                "examples": {"enabled": False},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": False},
            },
            "generation": {"deterministic": True, "max-examples": EXAMPLES_PER_OPERATION},
            "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
            # Routes with data: the fleet, model and node made above (other ids are generated).
            "parameters": {
                "path.fleet": FLEET,
                "path.model": MODEL,
                "path.version": VERSION,
                "path.node_id": api_under_test.node_id,
                "path.token_id": api_under_test.victim_token_id,
            },
        }
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", api_under_test.app, config=config)
    operations: set[str] = set()
    failures: list[str] = []
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            operations.add(event.recorder.label)
            failures.extend(
                f"{event.recorder.label} ({event.phase.value}) {check.name}: "
                f"{check.failure_info.failure}"[:1500]
                for checks in event.recorder.checks.values()
                for check in checks
                if check.failure_info is not None
            )
        elif isinstance(event, events.NonFatalError):
            failures.append(f"{event.label}: {event.value!r}"[:1500])
        elif isinstance(event, events.FatalError):
            raise event.exception
    assert len(operations) > 40  # the whole API ran, not a part that happened to load
    assert not failures, "\n\n".join(sorted(set(failures)))


# ------------------------------------------------- what the run relies on, and found


def test_the_document_declares_bearer_auth_on_every_route_that_takes_a_token(
    api_under_test: _Api,
) -> None:
    document = api_under_test.app.openapi()
    assert document["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API token (`edgefleet token create`).",
    }
    secured = {
        f"{method.upper()} {path}"
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if operation.get("security") == [{"HTTPBearer": []}]
    }
    assert {"GET /v1/fleets", "POST /v1/tokens", "GET /v1/audit"} <= secured
    # Public routes stay public: probes, the CA, TUF metadata, enrollment.
    assert not {"GET /healthz", "GET /v1/ca.pem", "POST /v1/enroll"} & secured
    assert "GET /v1/fleets/{fleet}/tuf/metadata/{filename}" not in secured


def test_errors_are_documented_as_the_problems_the_api_sends(api_under_test: _Api) -> None:
    document = api_under_test.app.openapi()
    responses = document["paths"]["/v1/fleets/{fleet}"]["get"]["responses"]
    for status in ("400", "401", "403", "404", "409", "413", "422", "503"):
        assert responses[status]["content"] == {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        }
    assert "HTTPValidationError" not in document["components"]["schemas"]
    with TestClient(api_under_test.app) as http:
        answer = http.get(f"/v1/fleets/{FLEET}")  # no token
    assert answer.status_code == 401
    assert answer.headers["content-type"] == "application/problem+json"


def test_the_ca_certificate_is_documented_with_the_type_it_is_served_with(
    api_under_test: _Api,
) -> None:
    # Found by the run: documented text/plain, served application/x-pem-file.
    document = api_under_test.app.openapi()
    content = document["paths"]["/v1/ca.pem"]["get"]["responses"]["200"]["content"]
    with TestClient(api_under_test.app) as http:
        answer = http.get("/v1/ca.pem")
    assert list(content) == ["application/x-pem-file"]
    assert answer.headers["content-type"].split(";")[0] == "application/x-pem-file"
    assert answer.text.startswith("-----BEGIN CERTIFICATE-----")


def test_artifacts_are_documented_as_the_bytes_they_are(api_under_test: _Api) -> None:
    # Found by the run: documented application/json, served application/octet-stream.
    document = api_under_test.app.openapi()
    for path in (
        "/v1/fleets/{fleet}/models/{model}/versions/{version}/artifact",
        "/v1/fleets/{fleet}/tuf/targets/{path}",
    ):
        responses = document["paths"][path]["get"]["responses"]
        assert list(responses["200"]["content"]) == ["application/octet-stream"]
        assert list(responses["206"]["content"]) == ["application/octet-stream"]
        assert "content" not in responses["416"]  # answered with no body
    with TestClient(api_under_test.app) as http:
        answer = http.get(
            f"/v1/fleets/{FLEET}/models/{MODEL}/versions/{VERSION}/artifact",
            headers={"Authorization": f"Bearer {api_under_test.token}", "Range": "bytes=0-3"},
        )
    assert answer.status_code == 206
    assert answer.headers["content-type"] == "application/octet-stream"


def test_the_artifact_probe_is_documented_without_a_body(api_under_test: _Api) -> None:
    # Found by the run: HEAD documented application/json, answered with no content type.
    document = api_under_test.app.openapi()
    responses = document["paths"]["/v1/artifacts/{sha256}"]["head"]["responses"]
    assert "content" not in responses["200"] and "content" not in responses["404"]
    with TestClient(api_under_test.app) as http:
        answer = http.head(
            "/v1/artifacts/" + "0" * 64,
            headers={"Authorization": f"Bearer {api_under_test.token}"},
        )
    assert answer.status_code == 404
    assert "content-type" not in answer.headers
