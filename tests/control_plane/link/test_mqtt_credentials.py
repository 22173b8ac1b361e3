"""MQTT credentials end to end: enrollment hands them out, `GET /v1/mqtt/credentials` (admin)
exports the hashes, `edgefleet mqtt acl` writes the broker's files, and Mosquitto accepts
them. Also the server's `--mqtt` settings and the bridge in the API's lifespan."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import paho.mqtt.publish as publish
import pytest
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.cli.main import main
from control_plane.errors import InvalidInputError
from control_plane.link.mqtt_acl import check_mosquitto_password
from control_plane.link.mqtt_bridge import CONTROL_PLANE_PASSWORD_FILE, MqttBridge
from control_plane.services import ServiceConfig, build_services
from control_plane.settings import ServerSettings
from tests.control_plane.conftest import LiveServer
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.link.mqtt_helpers import bridge_config
from tests.mqtt_support import BrokerFactory, broker_factory, try_connect  # noqa: F401


def enroll(server: LiveServer, transport: str) -> dict[str, Any]:
    with server.api() as api:
        token = api.json("POST", "/v1/fleets/gates/node-tokens", json={})["token"]
    with server.api(token="") as anonymous:
        enrolled: dict[str, Any] = anonymous.json(
            "POST",
            "/v1/enroll",
            json={"token": token, "csr_pem": make_csr().decode(), "transport": transport},
        )
    return enrolled


def run_cli(server: LiveServer, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["--server", server.url, "--token", server.admin_token, *args])
    out, err = capsys.readouterr()
    return code, out + err


def test_enroll_export_write_and_connect(
    live_server: LiveServer,
    capsys: pytest.CaptureFixture[str],
    broker_factory: BrokerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    with live_server.api() as api:
        api.create_fleet("gates")
    mqtt_node = enroll(live_server, "mqtt")
    grpc_node = enroll(live_server, "grpc")
    revoked = enroll(live_server, "mqtt")
    assert mqtt_node["mqtt_username"] == mqtt_node["node_id"]
    assert len(mqtt_node["mqtt_password"]) >= 40
    assert grpc_node["mqtt_username"] is None and grpc_node["mqtt_password"] is None
    with live_server.api() as api:
        api.json("POST", f"/v1/nodes/{revoked['node_id']}/revoke")
        exported = api.json("GET", "/v1/mqtt/credentials")
    assert [n["node_id"] for n in exported["nodes"]] == [mqtt_node["node_id"]]
    assert check_mosquitto_password(
        mqtt_node["mqtt_password"], exported["nodes"][0]["password_hash"]
    )
    assert mqtt_node["mqtt_password"] not in json.dumps(exported)

    out_dir = tmp_path / "mosquitto"
    code, output = run_cli(
        live_server, capsys, "--output", "json", "mqtt", "acl", "--out", str(out_dir)
    )
    assert code == 0, output
    summary = json.loads(output)
    assert summary["nodes"] == 1 and summary["control_plane_user"] == "edgefleet-control-plane"
    acl = (out_dir / "acl").read_text()
    assert f"user {mqtt_node['node_id']}" in acl
    assert grpc_node["node_id"] not in acl and revoked["node_id"] not in acl
    code, output = run_cli(live_server, capsys, "mqtt", "acl", "--out", str(out_dir))
    assert code == 0 and "kill -HUP" in output

    broker = broker_factory(passwd=out_dir / "passwd", acl=out_dir / "acl", persistence=False)
    own = (live_server.services.config.data_dir / CONTROL_PLANE_PASSWORD_FILE).read_text().strip()
    assert try_connect(broker.port, "edgefleet-control-plane", own) == 0
    assert try_connect(broker.port, mqtt_node["node_id"], mqtt_node["mqtt_password"]) == 0
    assert try_connect(broker.port, revoked["node_id"], revoked["mqtt_password"]) == 135

    with live_server.api() as api:
        audit = api.json("GET", "/v1/audit", params={"action": "mqtt.credentials.export"})
    assert len(audit) == 3  # the GET above and two CLI runs


def test_only_admins_export_credentials(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with live_server.api() as api:
        operator = api.json("POST", "/v1/tokens", json={"name": "ops", "role": "operator"})["token"]
    with live_server.api(token=operator) as api:
        response = api._http.get("/v1/mqtt/credentials")
    assert response.status_code == 403
    assert "needs role admin" in response.json()["detail"]
    capsys.readouterr()
    code = main(
        ["--server", live_server.url, "--token", operator, "mqtt", "acl", "--out", str(tmp_path)]
    )
    assert code == 1
    assert not (tmp_path / "passwd").exists()
    assert not (live_server.services.config.data_dir / CONTROL_PLANE_PASSWORD_FILE).exists()


def test_server_settings_for_the_bridge(tmp_path: Path) -> None:
    assert ServerSettings().mqtt_bridge_config() is None
    secret = tmp_path / "cp-password"
    secret.write_text("s3cret\n")
    config = ServerSettings(
        mqtt="broker.local:8883", mqtt_password_file=secret, mqtt_client_id="cp-0"
    ).mqtt_bridge_config()
    assert config is not None
    assert (config.host, config.port, config.password, config.client_id) == (
        "broker.local",
        8883,
        "s3cret",
        "cp-0",
    )
    assert config.username == "edgefleet-control-plane"
    assert "s3cret" not in repr(config)
    with pytest.raises(ValueError, match="HOST:PORT"):
        ServerSettings(mqtt="broker.local")
    secret.write_text("\n")
    with pytest.raises(InvalidInputError, match="empty"):
        ServerSettings(mqtt="b:1", mqtt_password_file=secret).mqtt_bridge_config()
    with pytest.raises(InvalidInputError, match="cannot read"):
        ServerSettings(mqtt="b:1", mqtt_password_file=tmp_path / "nope").mqtt_bridge_config()


def test_server_settings_for_broker_accounts_and_tls(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    settings = ServerSettings(
        mqtt="broker.local:8883",
        mqtt_accounts="dynsec",
        mqtt_tls=True,
        mqtt_ca_file=ca,
        mqtt_share_group="cp-1a2b3c",
    )
    config = settings.mqtt_bridge_config()
    assert config is not None
    assert (config.tls, config.ca_file, config.share_group) == (True, ca, "cp-1a2b3c")
    assert config.resolved_client_id().startswith("edgefleet-control-plane-")
    assert ServerSettings().mqtt_accounts == "file"
    with pytest.raises(ValueError, match="needs mqtt"):
        ServerSettings(mqtt_accounts="dynsec")
    with pytest.raises(ValueError, match="need mqtt_tls"):
        ServerSettings(mqtt="b:1", mqtt_ca_file=ca)
    with pytest.raises(ValueError, match="go together"):
        ServerSettings(mqtt="b:1", mqtt_tls=True, mqtt_cert_file=ca)
    with pytest.raises(ValueError, match="pattern"):
        ServerSettings(mqtt="b:1", mqtt_share_group="$share/#")


def test_the_api_lifespan_runs_the_bridge_when_configured(
    service_config: ServiceConfig,
    broker_factory: BrokerFactory,  # noqa: F811
) -> None:
    broker = broker_factory(persistence=False)
    services = build_services(
        dataclasses.replace(service_config, mqtt=bridge_config(broker, client_id="cp-lifespan"))
    )
    try:
        with TestClient(create_app(services, run_background=False)) as client:
            bridge = client.app.state.mqtt_bridge  # type: ignore[attr-defined]
            assert isinstance(bridge, MqttBridge)
            assert bridge.wait_connected(15)
            # What the bridge counts is on /metrics (a refusal here: bytes, not protobuf).
            publish.single(
                "edgefleet/v1/gates/n-1/events",
                b"\xff not protobuf",
                qos=1,
                hostname="127.0.0.1",
                port=broker.port,
                protocol=mqtt.MQTTv5,
            )
            refused = 'edgefleet_link_refusals_total{reason="malformed-message",transport="mqtt"}'
            deadline = time.monotonic() + 15
            text = ""
            while time.monotonic() < deadline and f"{refused} 1.0" not in text:
                time.sleep(0.05)
                text = client.get("/metrics").text
            assert f"{refused} 1.0" in text, text
            assert 'edgefleet_link_records_acked_total{transport="mqtt"} 0.0' in text
        assert not bridge.connected  # stopped with the app
    finally:
        services.close()


def test_without_mqtt_settings_there_is_no_bridge(client: TestClient) -> None:
    assert client.app.state.mqtt_bridge is None  # type: ignore[attr-defined]
