"""No request waits for the database on the event loop: with the database's write lock
held by another connection (SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's ``LOCK TABLE``),
each mutating route waits in a worker thread while ``/healthz`` answers at once, and
completes when the lock goes.

The routes are read from the app's OpenAPI schema, so a new mutating route fails
`test_every_mutating_route_has_a_case` until it has a case below.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
import psycopg
import pytest
from securesystemslib.signer import CryptoSigner
from sqlalchemy import make_url

from control_plane.api.app import create_app
from control_plane.cli.client import ApiClient
from control_plane.cli.release import ReleaseClient
from control_plane.registry import sample_models
from control_plane.services import Services
from control_plane.storage import session_factory
from control_plane.storage.models import Base, HealthAlertRow
from control_plane.trust.keys import OperatorKeyset, init_operator_keys
from tests.control_plane.conftest import LiveServer
from tests.control_plane.identity.helpers import make_csr

# What probes may take while a mutation waits on the lock: their median, and any one of
# them. A loop stalled by the mutation holds a probe for the whole wait (SQLite's busy
# timeout, 5 s; on PostgreSQL until the client gives up), far beyond either; a loaded
# shared CI machine delays a single probe by a few hundred ms now and then (once 1.5 s,
# with two test workers and other work on two cores): the median is the stall detector,
# the single-probe limit only catches a loop held for seconds.
PROBE_LIMIT_S = 0.3
STALL_LIMIT_S = 2.5
# How long each mutation is held on the lock while /healthz is probed.
HOLD_S = 0.6
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass
class Call:
    """One request as the case prepared it, and the status it must end with."""

    method: str
    path: str
    expect: int
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    token: bool = True  # sent with the admin token


class CapturingApi(ApiClient):
    """Sends everything but the one call a case wants to make itself under the lock."""

    def __init__(self, server: LiveServer, capture: str) -> None:
        super().__init__(server.url, server.admin_token)
        self.capture = capture
        self.captured: Call | None = None

    def upload_root(self, fleet: str, root: dict[str, Any], targets: dict[str, Any]) -> Any:
        if self.capture != "upload_root":
            return super().upload_root(fleet, root, targets)
        body = {"root": root, "targets": targets}
        self.captured = Call("PUT", f"/v1/fleets/{fleet}/root", 200, json=body)
        return {}

    def rotate_root(self, fleet: str, root: dict[str, Any], targets: dict[str, Any]) -> Any:
        if self.capture != "rotate_root":
            return super().rotate_root(fleet, root, targets)
        body = {"root": root, "targets": targets}
        self.captured = Call("POST", f"/v1/fleets/{fleet}/root", 200, json=body)
        return {"root_version": 0, "targets_version": 0}

    def push_targets(self, fleet: str, targets: bytes) -> Any:
        if self.capture != "push_targets":
            return super().push_targets(fleet, targets)
        headers = {"Content-Type": "application/json"}
        self.captured = Call(
            "POST", f"/v1/fleets/{fleet}/targets", 201, content=targets, headers=headers
        )
        return {"targets_version": 0}


@dataclass
class World:
    """What the cases build on: a live fleet with a model, and a way to make more."""

    server: LiveServer
    keyset: OperatorKeyset
    tmp: Path
    fleet: str = "parks"

    def api(self) -> ApiClient:
        return self.server.api()

    def captured(self, capture: str, act: Callable[[ReleaseClient], object]) -> Call:
        api = CapturingApi(self.server, capture)
        with api:
            act(ReleaseClient(api, self.keyset))
        assert api.captured is not None
        return api.captured

    def node_token(self) -> dict[str, Any]:
        with self.api() as api:
            created: dict[str, Any] = api.json(
                "POST", f"/v1/fleets/{self.fleet}/node-tokens", json={"labels": {"site": "a"}}
            )
        return created

    def enroll(self) -> str:
        body = {"token": self.node_token()["token"], "csr_pem": make_csr().decode()}
        with self.api() as api:
            node_id: str = api.json("POST", "/v1/enroll", json=body)["node_id"]
        return node_id


def create_fleet(world: World) -> Call:
    return Call("POST", "/v1/fleets", 201, json={"name": "fresh"})


def upload_root(world: World) -> Call:
    return world.captured("upload_root", lambda release: release.create_fleet("pending"))


def rotate_root(world: World) -> Call:
    with world.api() as api:
        ReleaseClient(api, world.keyset).create_fleet("rotating")
    signer = CryptoSigner.generate_ed25519()
    return world.captured(
        "rotate_root", lambda release: release.rotate_release_key("rotating", signer)
    )


def new_online_keys(world: World) -> Call:
    return Call("POST", f"/v1/fleets/{world.fleet}/online-keys", 201)


def new_director_key(world: World) -> Call:
    return Call("POST", "/v1/director/keys", 201)


def push_targets(world: World) -> Call:
    model = sample_models.tiny_detector(world.tmp / "v2.onnx")
    return world.captured(
        "push_targets",
        lambda release: release.push_model(world.fleet, model, name="detector", version="2.0.0"),
    )


def upload_artifact(world: World) -> Call:
    data = os.urandom(256 << 10)
    sha256 = hashlib.sha256(data).hexdigest()
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(data))}
    return Call("PUT", f"/v1/artifacts/{sha256}", 201, content=data, headers=headers)


def create_token(world: World) -> Call:
    return Call("POST", "/v1/tokens", 201, json={"name": "ci", "role": "viewer"})


def revoke_token(world: World) -> Call:
    with world.api() as api:
        token = api.json("POST", "/v1/tokens", json={"name": "old", "role": "viewer"})
    return Call("DELETE", f"/v1/tokens/{token['id']}", 200)


def create_node_token(world: World) -> Call:
    return Call("POST", f"/v1/fleets/{world.fleet}/node-tokens", 201, json={"ttl_s": 600})


def revoke_node_token(world: World) -> Call:
    return Call("POST", f"/v1/node-tokens/{world.node_token()['id']}/revoke", 200)


def enroll(world: World) -> Call:
    body = {"token": world.node_token()["token"], "csr_pem": make_csr().decode()}
    return Call("POST", "/v1/enroll", 201, json=body, token=False)


def patch_node(world: World) -> Call:
    return Call("PATCH", f"/v1/nodes/{world.enroll()}", 200, json={"labels": {"row": "3"}})


def revoke_node(world: World) -> Call:
    return Call("POST", f"/v1/nodes/{world.enroll()}/revoke", 200)


def pin_node(world: World) -> Call:
    body = {"model": "detector", "version": "1.0.0"}
    return Call("POST", f"/v1/nodes/{world.enroll()}/pin", 201, json=body)


def pin_fleet_nodes(world: World) -> Call:
    body = {"model": "detector", "version": "1.0.0", "node_ids": [world.enroll()]}
    return Call("POST", f"/v1/fleets/{world.fleet}/pin", 201, json=body)


def clear_alert(world: World) -> Call:
    node_id = world.enroll()
    now = datetime.now(UTC)
    with session_factory(world.server.services.engine)() as session:
        row = HealthAlertRow(
            node_id=node_id, kind="node_offline", since=now, updated_at=now, details={}
        )
        session.add(row)
        session.commit()
        alert_id = row.id
    return Call("POST", f"/v1/alerts/{alert_id}/clear", 200)


def create_rollout(world: World) -> Call:
    body = {"model": "detector", "version": "1.0.0", "stages": "1,100%", "selector": "site=new"}
    return Call("POST", f"/v1/fleets/{world.fleet}/rollouts", 201, json=body)


def command_rollout(world: World) -> Call:
    body = {"model": "detector", "version": "1.0.0", "stages": "1,100%", "selector": "site=old"}
    with world.api() as api:
        created = api.json("POST", f"/v1/fleets/{world.fleet}/rollouts", json=body)
    return Call("POST", f"/v1/rollouts/{created['id']}/pause", 200, json={"note": "wait"})


# (method, route path as the schema names it) -> how to make a valid call of it.
CASES: dict[tuple[str, str], Callable[[World], Call]] = {
    ("POST", "/v1/fleets"): create_fleet,
    ("PUT", "/v1/fleets/{fleet}/root"): upload_root,
    ("POST", "/v1/fleets/{fleet}/root"): rotate_root,
    ("POST", "/v1/fleets/{fleet}/online-keys"): new_online_keys,
    ("POST", "/v1/director/keys"): new_director_key,
    ("POST", "/v1/fleets/{fleet}/targets"): push_targets,
    ("PUT", "/v1/artifacts/{sha256}"): upload_artifact,
    ("POST", "/v1/tokens"): create_token,
    ("DELETE", "/v1/tokens/{token_id}"): revoke_token,
    ("POST", "/v1/fleets/{fleet}/node-tokens"): create_node_token,
    ("POST", "/v1/node-tokens/{token_id}/revoke"): revoke_node_token,
    ("POST", "/v1/enroll"): enroll,
    ("PATCH", "/v1/nodes/{node_id}"): patch_node,
    ("POST", "/v1/nodes/{node_id}/revoke"): revoke_node,
    ("POST", "/v1/nodes/{node_id}/pin"): pin_node,
    ("POST", "/v1/fleets/{fleet}/pin"): pin_fleet_nodes,
    ("POST", "/v1/alerts/{alert_id}/clear"): clear_alert,
    ("POST", "/v1/fleets/{fleet}/rollouts"): create_rollout,
    ("POST", "/v1/rollouts/{rollout_id}/{command}"): command_rollout,
}


def mutating_routes(services: Services) -> set[tuple[str, str]]:
    schema = create_app(services, run_background=False).openapi()
    return {
        (method.upper(), path)
        for path, operations in schema["paths"].items()
        for method in operations
        if method.upper() in MUTATING
    }


@pytest.fixture
def world(live_server: LiveServer, tmp_path: Path) -> World:
    keyset = init_operator_keys(tmp_path / "keys", root_keys=1, root_threshold=1, passphrase=None)
    world = World(live_server, keyset, tmp_path)
    with world.api() as api:
        release = ReleaseClient(api, keyset)
        release.create_fleet(world.fleet)
        model = sample_models.tiny_detector(tmp_path / "v1.onnx")
        release.push_model(world.fleet, model, name="detector", version="1.0.0")
    return world


@pytest.fixture
def database_lock(services: Services) -> Iterator[DatabaseLock]:
    url = make_url(services.config.database_url)
    lock: DatabaseLock
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        lock = SqliteLock(Path(url.database))
    else:
        lock = PostgresLock(url.set(drivername="postgresql").render_as_string(False))
    try:
        yield lock
    finally:
        lock.close()


class DatabaseLock(Protocol):
    """Another connection keeping every writer out, as a busy writer elsewhere would;
    readers still read."""

    def hold(self) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class SqliteLock:
    """SQLite's one write lock (``BEGIN IMMEDIATE``); readers go on (WAL)."""

    def __init__(self, path: Path) -> None:
        self._connection = sqlite3.connect(path, isolation_level=None, timeout=10)

    def hold(self) -> None:
        self._connection.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self._connection.execute("ROLLBACK")

    def close(self) -> None:
        self._connection.close()


class PostgresLock:
    """Every table of the schema in EXCLUSIVE mode: writes wait, plain reads go on."""

    def __init__(self, dsn: str) -> None:
        self._connection = psycopg.connect(dsn)
        self._tables = ", ".join(sorted(Base.metadata.tables))

    def hold(self) -> None:
        self._connection.execute(f"LOCK TABLE {self._tables} IN EXCLUSIVE MODE")

    def release(self) -> None:
        self._connection.rollback()

    def close(self) -> None:
        self._connection.close()


def send(server: LiveServer, call: Call) -> httpx.Response:
    headers = dict(call.headers)
    if call.token:
        headers["Authorization"] = f"Bearer {server.admin_token}"
    with httpx.Client(base_url=server.url, timeout=30) as http:
        return http.request(
            call.method, call.path, json=call.json, content=call.content, headers=headers
        )


def probe_while(server: LiveServer, pending: concurrent.futures.Future[Any]) -> list[float]:
    """Probe /healthz for `HOLD_S`; each probe's time. The mutation must stay pending
    throughout: proof it really waits on the lock while the probes are answered."""
    times: list[float] = []
    with httpx.Client(base_url=server.url, timeout=10) as http:
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert http.get("/healthz").json() == {"status": "ok"}
            times.append(time.monotonic() - started)
            if pending.done():
                raise AssertionError(
                    f"the mutation ended while the lock was held ({pending.result()}), "
                    f"after probes of {[round(t, 3) for t in times]} s"
                )
    return times


def test_every_mutating_route_has_a_case(services: Services) -> None:
    assert mutating_routes(services) == set(CASES)


def test_healthz_answers_while_each_mutation_waits_on_the_database_lock(
    live_server: LiveServer, world: World, database_lock: DatabaseLock
) -> None:
    calls = {route: make(world) for route, make in CASES.items()}  # all before any lock
    slow: dict[tuple[str, str], float] = {}
    every: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        for route, call in calls.items():
            database_lock.hold()
            try:
                pending = pool.submit(send, live_server, call)
                try:
                    times = probe_while(live_server, pending)
                except AssertionError as exc:
                    raise AssertionError(f"{route}: {exc}") from None
            finally:
                database_lock.release()
            response = pending.result(timeout=30)
            assert response.status_code == call.expect, (route, response.text)
            assert len(times) >= 2, route
            every.extend(times)
            if max(times) >= STALL_LIMIT_S:
                slow[route] = max(times)
    assert slow == {}
    assert statistics.median(every) < PROBE_LIMIT_S
