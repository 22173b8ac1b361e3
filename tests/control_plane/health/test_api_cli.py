"""Fleet health over REST and the CLI, /metrics, and the processor in the API lifespan."""

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
from control_plane.api.routes import fleet_health
from control_plane.cli.main import main
from control_plane.health.config import HealthConfig
from control_plane.services import ServiceConfig, Services
from control_plane.storage import session_factory
from control_plane.storage.models import NodeRow
from tests.control_plane.conftest import LiveServer
from tests.control_plane.health.support import Sender, add_nodes, v1_report, v2_report


@pytest.fixture
def service_config(tmp_path: Path, database_url: str) -> ServiceConfig:
    data = tmp_path / "server"
    return ServiceConfig(
        data_dir=data,
        database_url=database_url,
        artifacts_url=(data / "artifacts").as_uri(),
        refresh_interval_s=3600,
        health=HealthConfig(settle=timedelta(0), interval_s=0.1),
    )


@pytest.fixture
def sender(services: Services) -> Sender:
    add_nodes(session_factory(services.engine), "n-a", "n-b", "n-c")
    return Sender(services.records)


def fill(services: Services, sender: Sender) -> None:
    now = datetime.now(UTC)
    sender.send(
        "n-a",
        v2_report(now - timedelta(minutes=3), rss_mb=500, slope=1.5),
        v2_report(
            now - timedelta(minutes=2),
            rss_mb=820,
            slope=42.0,
            leak=True,
            drift_ratio=2.1,
            streams={
                "cam1": {
                    "bad": {"corrupt": 4, "shape": 1},
                    "captured": 30,
                    "capture_failed": {"timeout": 3},
                    "capture_passed_over": {"superseded": 7, "empty": 2, "stale": 1},
                }
            },
        ),
    )
    sender.send("n-b", v1_report())
    services.health.processor.process_pending(now + timedelta(seconds=1))


class Cli:
    def __init__(self, server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
        self.server = server
        self.capsys = capsys

    def run(self, *args: str, token: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(
            ["--server", self.server.url, "--token", token or self.server.admin_token, *args]
        )
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self.run("--output", "json", *args)
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def cli(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.setenv("COLUMNS", "200")
    return Cli(live_server, capsys)


def test_rest_fleet_health_series_and_alerts(
    client: TestClient, services: Services, sender: Sender
) -> None:
    fill(services, sender)
    glance = {n["id"]: n for n in client.get("/v1/health/nodes").json()}
    assert glance["n-a"]["status"] == "alert"
    assert glance["n-a"]["metrics"]["rss_bytes"] == 820e6
    assert glance["n-a"]["metrics"]["drift_p99_ratio"] == 2.1
    assert glance["n-a"]["alerts"] == ["drift", "leak_suspected", "memory_headroom_low"]
    assert glance["n-b"]["status"] == "ok" and glance["n-b"]["schema"].endswith("/1")
    assert glance["n-c"]["status"] == "no-data"
    in_fleet = client.get("/v1/health/nodes", params={"fleet": "gates"}).json()
    assert [n["alerts"] for n in in_fleet] == [glance[n["id"]]["alerts"] for n in in_fleet]
    assert len(in_fleet) == 3
    # A selection too large for an IN list reads every row and keeps the selected ones.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fleet_health, "_MAX_ID_LIST", 1)
        large = client.get("/v1/health/nodes", params={"fleet": "gates"}).json()
    assert large == in_fleet

    series = client.get("/v1/nodes/n-a/health", params={"since": "1h"}).json()
    assert series["resolution"] == "raw"
    assert [p["metrics"]["rss_bytes"] for p in series["points"]] == [500e6, 820e6]
    daily = client.get("/v1/nodes/n-a/health", params={"since": "2d"}).json()
    assert daily["resolution"] == "minute"
    assert sum(p["reports"] for p in daily["points"]) == 2
    hour = client.get("/v1/nodes/n-a/health", params={"since": "3600"}).json()
    assert hour["points"] == series["points"]
    bad = client.get("/v1/nodes/n-a/health", params={"since": "soon"})
    assert bad.status_code == 400
    assert "'soon' is not a duration" in bad.json()["detail"]
    assert bad.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/nodes/nope/health").status_code == 404

    alerts = client.get("/v1/alerts", params={"node": "n-a"}).json()
    assert {a["kind"] for a in alerts} == {"drift", "leak_suspected", "memory_headroom_low"}
    leak = next(a for a in alerts if a["kind"] == "leak_suspected")
    assert leak["details"]["rss_slope_mb_per_h"] == 42.0

    viewer_token = client.post("/v1/tokens", json={"name": "v", "role": "viewer"}).json()["token"]
    viewer = {"Authorization": f"Bearer {viewer_token}"}
    assert client.get("/v1/alerts", headers=viewer).status_code == 200
    refused = client.post(f"/v1/alerts/{leak['id']}/clear", headers=viewer)
    assert refused.status_code == 403
    cleared = client.post(f"/v1/alerts/{leak['id']}/clear").json()
    assert cleared["open"] is False and cleared["cleared_by"] == "operator:bootstrap-admin"
    assert client.post(f"/v1/alerts/{leak['id']}/clear").status_code == 409
    assert client.get("/v1/alerts", params={"kind": "nonsense"}).status_code == 400
    actions = [e["action"] for e in client.get("/v1/audit").json()]
    assert "alert.clear" in actions


def test_metrics_are_fleet_level(client: TestClient, services: Services, sender: Sender) -> None:
    fill(services, sender)
    sender.send("n-b", b"garbage")
    services.health.processor.process_pending(datetime.now(UTC) + timedelta(seconds=1))
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for line in (
        'edgefleet_nodes{state="online"} 3.0',
        'edgefleet_alerts_open{kind="drift"} 1.0',
        'edgefleet_alerts_open{kind="throttling"} 0.0',
        'edgefleet_node_records_stored_total{kind="health"} 4.0',
        "edgefleet_health_reports_processed_total 3.0",
        "edgefleet_health_reports_malformed_total 1.0",
        "edgefleet_health_processing_lag_seconds 0.0",
    ):
        assert line in text, line
    assert "n-a" not in text  # no per-node labels


def test_cli_nodes_list_health_and_alerts(cli: Cli, services: Services, sender: Sender) -> None:
    fill(services, sender)
    code, table, err = cli.run("nodes", "list")
    assert code == 0, err
    row = next(line for line in table.splitlines() if "n-a" in line)
    for cell in ("alert", "820", "42.0", "2.10", "18%", "drift,leak_suspected"):
        assert cell in row, cell
    listed = {n["id"]: n for n in cli.json("nodes", "list")}
    assert listed["n-a"]["health"]["metrics"]["p99_ms"] is not None

    code, table, err = cli.run("nodes", "health", "n-a", "--since", "1h")
    assert code == 0, err
    assert "2 raw points" in table and "820" in table
    # Corrupt frames and the drop directory's files passed over are shown, not only logged.
    header = next(line for line in table.splitlines() if "superseded" in line)
    names = [cell.strip() for cell in header.strip("┃").split("┃")]
    last = [line for line in table.splitlines() if "│" in line][-1]
    cells = dict(zip(names, (cell.strip() for cell in last.strip("│").split("│")), strict=True))
    assert (cells["bad"], cells["superseded"], cells["discarded"]) == ("5", "7", "3")
    assert cells["capture failed"] == "3"
    code, table, err = cli.run("nodes", "health", "n-a", "--since", "2d")
    assert code == 0 and "minute points" in table
    series = cli.json("nodes", "health", "n-a", "--since", "60d")
    assert series["resolution"] == "hour"
    # Bare seconds, as the API takes them: the CLI and the server share one parser.
    series = cli.json("nodes", "health", "n-a", "--since", "3600")
    assert series["resolution"] == "raw" and len(series["points"]) == 2
    code, _, err = cli.run("nodes", "health", "n-a", "--since", "later")
    assert code != 0
    assert "'later' is not a duration" in err

    code, table, err = cli.run("alerts", "list")
    assert code == 0, err
    assert "memory_headroom_low" in table and "headroom_ratio=0.18" in table
    alerts = cli.json("alerts", "list", "--node", "n-a", "--kind", "drift")
    (drift,) = alerts
    assert cli.json("alerts", "clear", str(drift["id"]))["cleared_by"].startswith("operator:")
    assert cli.json("alerts", "list", "--kind", "drift") == []
    assert [a["id"] for a in cli.json("alerts", "list", "--kind", "drift", "--all")] == [
        drift["id"]
    ]


def test_nodes_show_says_what_the_node_shadows(
    cli: Cli, services: Services, sender: Sender
) -> None:
    now = datetime.now(UTC)
    shadow = {
        "candidate": "detector@1.1.0",
        "state": "running",
        "against": "detector@1.0.0",
        "sample_per_mille": 100,
        "max_cpu_percent": 25,
        "frames_sampled": 130,
        "frames_compared": 120,
        "samples_dropped": 6,
        "samples_skipped_cpu": 4,
        "cpu_percent": 3.25,
        "agreement": {"kind": "detection", "frames": 120, "recall": 0.975, "precision": 0.95},
        "latency": {"p50_ms": 8.0, "p99_ms": 14.5, "sketch_ms": {"v": 1, "n": 0}},
        "reference_latency": {"p50_ms": 7.5, "p99_ms": 14.0, "sketch_ms": {"v": 1, "n": 0}},
        "latency_ratio_p50": 1.04,
        "rss_delta_bytes": 21_500_000,
    }
    sender.send("n-a", v2_report(now - timedelta(minutes=1), shadow=shadow))
    sender.send("n-b", v2_report(now - timedelta(minutes=1)))
    services.health.processor.process_pending(datetime.now(UTC) + timedelta(seconds=1))

    code, out, err = cli.run("nodes", "show", "n-a")
    assert code == 0, err
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("shadow: "))
    assert lines[head].startswith("shadow: detector@1.1.0 running beside detector@1.0.0 (report ")
    assert lines[head + 1 : head + 3] == [
        "  120 frames compared of 130 sampled (6 dropped busy, 4 skipped for CPU, 0 failed)",
        "  agreement (detection): recall 0.975, precision 0.950; p99 14.5 ms (active 14 ms "
        "on the same frames, ratio 1.04); CPU 3.25 %; RSS +21.5 MB",
    ]
    shown = cli.json("nodes", "show", "n-a")["shadow"]
    assert (shown["candidate"], shown["state"], shown["frames_compared"]) == (
        "detector@1.1.0",
        "running",
        120,
    )
    assert shown["latency_ms"] == {"p50_ms": 8.0, "p99_ms": 14.5}
    assert shown["reference_latency_ms"] == {"p50_ms": 7.5, "p99_ms": 14.0}
    assert shown["latency_ratio_p50"] == 1.04
    assert shown["agreement"]["recall"] == 0.975
    # A node that shadows nothing shows no shadow line.
    code, out, err = cli.run("nodes", "show", "n-b")
    assert code == 0 and "shadow:" not in out
    assert cli.json("nodes", "show", "n-b")["shadow"] is None

    failed = {"candidate": "detector@1.1.0", "state": "failed", "reason": "self-test"}
    failed["detail"] = "self-test: output-mismatch: max abs diff 0.41 > atol 0.0001"
    sender.send("n-a", v2_report(now, shadow=failed))
    services.health.processor.process_pending(datetime.now(UTC) + timedelta(seconds=1))
    code, out, err = cli.run("nodes", "show", "n-a")
    assert code == 0, err
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("shadow: "))
    assert lines[head].startswith("shadow: detector@1.1.0 failed (report ")
    assert lines[head + 1] == "  " + failed["detail"]


def test_nodes_show_says_where_the_served_models_runtime_settings_come_from(
    cli: Cli, services: Services, sender: Sender
) -> None:
    """Issue 12 §1: a signed version runs with its signed config; node.yaml overrides only
    per-box session settings, and the control plane says which (from model_runtime)."""
    now = datetime.now(UTC)
    signed = {
        "config": "signed",
        "session_overrides": ["intra_op_threads", "execution_providers"],
        "node_preprocess_ignored": True,
    }
    sender.send("n-a", v2_report(now - timedelta(minutes=1), model_runtime=signed))
    sender.send("n-b", v2_report(now - timedelta(minutes=1), model_runtime={"config": "node"}))
    sender.send("n-c", v2_report(now - timedelta(minutes=1)))  # an agent that does not say
    services.health.processor.process_pending(datetime.now(UTC) + timedelta(seconds=1))

    code, out, err = cli.run("nodes", "show", "n-a")
    assert code == 0, err
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("runtime config: "))
    assert lines[head].startswith(
        "runtime config: signed with the version; node.yaml overrides runtime.session "
        "intra_op_threads, execution_providers (report "
    )
    assert lines[head + 1] == (
        "  node.yaml sets runtime.preprocess: not used, the signed spec replaces it"
    )
    shown = cli.json("nodes", "show", "n-a")["model_runtime"]
    assert {k: v for k, v in shown.items() if k != "reported_at"} == signed
    assert shown["reported_at"] is not None

    code, out, err = cli.run("nodes", "show", "n-b")
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith("runtime config: ")]
    assert line.startswith(
        "runtime config: node.yaml's runtime.preprocess (the version has no signed runtime "
        "spec); no node.yaml session overrides"
    )
    assert "signed spec replaces" not in out

    code, out, err = cli.run("nodes", "show", "n-c")
    assert code == 0 and "runtime config:" not in out
    assert cli.json("nodes", "show", "n-c")["model_runtime"] is None

    # The newest report decides: one without the section clears it.
    sender.send("n-a", v2_report(now))
    services.health.processor.process_pending(datetime.now(UTC) + timedelta(seconds=1))
    assert cli.json("nodes", "show", "n-a")["model_runtime"] is None


@pytest.fixture
def running_client(services: Services, sender: Sender) -> Iterator[TestClient]:
    with TestClient(create_app(services)) as test_client:
        yield test_client


def test_the_api_lifespan_runs_the_processor(
    running_client: TestClient, services: Services, sender: Sender
) -> None:
    sender.send("n-a", v2_report(datetime.now(UTC), rss_mb=950))
    with session_factory(services.engine)() as session:
        session.execute(update(NodeRow).where(NodeRow.id == "n-c").values(online=False))
        session.commit()
    deadline = time.monotonic() + 20
    kinds: set[tuple[str, str]] = set()
    while time.monotonic() < deadline:
        kinds = {(a.node_id, a.kind) for a in services.health.queries.list_alerts()}
        if {("n-a", "memory_headroom_low"), ("n-c", "node_offline")} <= kinds:
            break
        time.sleep(0.1)
    assert {("n-a", "memory_headroom_low"), ("n-c", "node_offline")} <= kinds


def test_a_failing_pass_is_counted_and_the_loop_goes_on(
    services: Services, sender: Sender, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = services.health.processor.process_pending
    calls = {"n": 0}

    def flaky(now: datetime | None = None) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database went away")
        return real(now)

    monkeypatch.setattr(services.health.processor, "process_pending", flaky)
    sender.send("n-a", v2_report(datetime.now(UTC)))
    with TestClient(create_app(services)):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not services.health.queries.latest(["n-a"]):
            time.sleep(0.05)
    assert services.health.processor.failed_passes == 1
    assert services.health.queries.latest(["n-a"])


def test_a_replica_without_the_processor_stores_but_does_not_process(
    service_config: ServiceConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # EDGEFLEET_HEALTH_PROCESSOR=false: this replica only ingests; another processes.
    import dataclasses

    from control_plane.services import build_services

    services = build_services(dataclasses.replace(service_config, health_processor=False))
    try:
        sender = Sender(services.records)
        add_nodes(session_factory(services.engine), "n-a")
        calls = {"n": 0}
        real = services.health.processor.process_pending

        def counted(now: datetime | None = None) -> int:
            calls["n"] += 1
            return real(now)

        monkeypatch.setattr(services.health.processor, "process_pending", counted)
        sender.send("n-a", v2_report(datetime.now(UTC)))
        with TestClient(create_app(services)):
            time.sleep(1.0)  # ten of the processor's 0.1 s intervals
        assert calls["n"] == 0
        assert services.records.count("n-a") == 1
        assert not services.health.queries.latest(["n-a"])
    finally:
        services.close()


def test_the_processor_setting_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from control_plane.server import service_config
    from control_plane.settings import ServerSettings

    assert service_config(ServerSettings()).health_processor is True
    monkeypatch.setenv("EDGEFLEET_HEALTH_PROCESSOR", "false")
    assert service_config(ServerSettings()).health_processor is False
