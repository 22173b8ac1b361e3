"""The event store over REST (pages, filters, roles, problems) and the CLI (`events list`,
`events tail` following by cursor) against a real server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from control_plane.api.app import create_app
from control_plane.cli.commands import events as events_cli
from control_plane.cli.main import main
from control_plane.events.query import EventQuery, EventsConfig
from control_plane.services import ServiceConfig, Services
from control_plane.storage import session_factory
from control_plane.storage.models import FleetEventRow
from tests.control_plane.conftest import LiveServer
from tests.control_plane.events.support import event, event_record
from tests.control_plane.health.support import add_nodes


@pytest.fixture
def service_config(tmp_path: Path, database_url: str) -> ServiceConfig:
    data = tmp_path / "server"
    return ServiceConfig(
        data_dir=data,
        database_url=database_url,
        artifacts_url=(data / "artifacts").as_uri(),
        refresh_interval_s=3600,
        # Pruned every 50 ms: the lifespan test below waits for a pass, not a timer.
        events=EventsConfig(settle=timedelta(0), prune_interval_s=0.05),
    )


class Sender:
    """Stores events as node `n-a` or `n-b` sent them, through the record ingest."""

    def __init__(self, services: Services) -> None:
        add_nodes(session_factory(services.engine), "n-a", "n-b")
        self.records = services.records
        self.seq = 0
        self.base = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)

    def send(self, node: str, n: int, **kw: Any) -> str:
        self.seq += 1
        kw.setdefault("at", self.base + timedelta(minutes=n))
        sent = event(n, **kw)
        self.records.store(node, [event_record(self.seq, sent)])
        return sent.event_id


@pytest.fixture
def sender(services: Services) -> Sender:
    return Sender(services)


def test_rest_pages_filters_roles_and_problems(client: TestClient, sender: Sender) -> None:
    sent = [sender.send("n-a", n) for n in range(1, 6)]
    zone = sender.send("n-b", 6, type_="zone.intrusion", rule="yard-zone")
    url = "/v1/fleets/gates/events"

    seen: list[str] = []
    cursor = None
    for _ in range(5):  # bounded: three pages of two
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get(url, params=params).json()
        seen += [e["event_id"] for e in page["events"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [zone, *reversed(sent)]

    first = client.get(url, params={"node": "n-b"}).json()["events"]
    assert [(e["node"], e["type"], e["rule_id"]) for e in first] == [
        ("n-b", "zone.intrusion", "yard-zone")
    ]
    assert first[0]["provenance"][0]["model_version"] == "1.1.0"
    assert first[0]["attributes"] == {"camera": "cam-1", "direction": "in"}
    recent = client.get(url, params={"since": "27m", "type": "line.crossed"}).json()["events"]
    assert [e["event_id"] for e in recent] == [sent[4], sent[3]]
    arrival = client.get(url, params={"order": "arrival", "since": "1h"}).json()
    assert [e["event_id"] for e in arrival["events"]] == [*sent, zone]
    assert arrival["next_cursor"]

    bad = client.get(url, params={"cursor": arrival["next_cursor"]})  # an arrival cursor
    assert bad.status_code == 400 and bad.json()["reason"] == "bad-cursor"
    assert bad.headers["content-type"].startswith("application/problem+json")
    assert client.get(url, params={"limit": 0}).status_code == 400
    assert client.get(url, params={"since": "soon"}).json()["reason"] == "bad-since"
    assert client.get("/v1/fleets/nowhere/events").status_code == 404

    viewer = client.post("/v1/tokens", json={"name": "v", "role": "viewer"}).json()["token"]
    assert client.get(url, headers={"Authorization": f"Bearer {viewer}"}).status_code == 200
    assert client.get(url, headers={"Authorization": "Bearer nope"}).status_code == 401


class Cli:
    def __init__(self, server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
        self.server = server
        self.capsys = capsys

    def run(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["--server", self.server.url, "--token", self.server.admin_token, *args])
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def cli(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cli]:
    monkeypatch.setenv("COLUMNS", "200")
    yield Cli(live_server, capsys)


def test_cli_lists_and_follows_events(
    cli: Cli, sender: Sender, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = sender.send("n-a", 1)
    second = sender.send("n-b", 2, type_="zone.intrusion", rule="yard-zone")

    code, out, err = cli.run("events", "list", "--fleet", "gates")
    assert code == 0, err
    lines = [line for line in out.splitlines() if "n-" in line]
    assert ["zone.intrusion" in lines[0], "line.crossed" in lines[1]] == [True, True]
    assert "track:cam-1/1 (person)" in lines[1] and "detector@1.1.0" in lines[1]
    assert "direction=in" in lines[1] and "count=1" in lines[1]

    code, out, err = cli.run("events", "list", "--fleet", "gates", "--node", "n-a", "--json")
    assert code == 0, err
    assert [e["event_id"] for e in json.loads(out)] == [first]
    code, out, _ = cli.run("events", "list", "--fleet", "gates", "--limit", "1")
    assert "the newest 1" in out
    code, _, err = cli.run("events", "list", "--fleet", "nowhere")
    assert code != 0 and "nowhere" in err

    # tail: what arrived in the last hour, then what arrives between two polls (the
    # poll's wait is where the third event comes in; no real sleeping).
    third: list[str] = []

    def arrive(_: float) -> None:
        if not third:
            third.append(sender.send("n-a", 3))

    monkeypatch.setattr(events_cli.time, "sleep", arrive)
    code, out, err = cli.run(
        "events", "tail", "--fleet", "gates", "--since", "1h", "--max", "3", "--json"
    )
    assert code == 0, err
    assert [json.loads(line)["event_id"] for line in out.splitlines()] == [first, second, *third]

    # Nothing new: a bounded tail ends at its timeout, having shown nothing.
    monkeypatch.setattr(events_cli.time, "sleep", lambda _: None)
    code, out, err = cli.run("events", "tail", "--fleet", "gates", "--timeout", "0.2")
    assert (code, out) == (0, ""), err


def test_the_api_lifespan_prunes_events_past_their_retention(
    services: Services, sender: Sender
) -> None:
    old = sender.send("n-a", 1, at=datetime.now(UTC) - timedelta(days=40))
    kept = sender.send("n-a", 2)
    with session_factory(services.engine)() as session:  # as if received 40 days ago too
        session.execute(
            update(FleetEventRow)
            .where(FleetEventRow.event_id == old)
            .values(received_at=datetime.now(UTC) - timedelta(days=40))
        )
        session.commit()
    left: list[str] = []
    with TestClient(create_app(services)):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            left = [e.event_id for e in services.events.page(EventQuery("gates")).events]
            if left == [kept]:
                break
            time.sleep(0.05)
    assert left == [kept]
