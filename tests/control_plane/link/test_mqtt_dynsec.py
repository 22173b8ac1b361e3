"""The broker attacks of issue 15 against a private Mosquitto with the dynamic security
plugin, whose node logins the control plane makes at enrollment and removes at
revocation (ADR 0043): client-id takeover, shared-subscription hijack, a revoked login
that lingers, an enrollment without a login, and the reconcile."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.subscribeoptions import SubscribeOptions
from prometheus_client import generate_latest
from sqlalchemy import update

from control_plane.api.routes.metrics import fleet_registry
from control_plane.errors import UnavailableError
from control_plane.link.broker_accounts import node_role
from control_plane.link.mqtt_acl import mosquitto_password_hash
from control_plane.link.mqtt_bridge import MqttBridge
from control_plane.link.mqtt_dynsec import DynsecAccounts
from control_plane.link.mqtt_topics import Leaf, node_topic
from control_plane.services import ServiceConfig, Services, build_services
from control_plane.storage import session_factory
from control_plane.storage.models import BootstrapTokenRow, NodeRow
from edge_node.link.base import LinkRefusedError, LinkUnavailableError, node_message
from edge_node.link.mqtt_link import MqttNodeLink
from protos.edgefleet.fleet.v1 import link_pb2
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.link.mqtt_helpers import (
    ADMIN,
    CP_PASSWORD,
    bridge_config,
    create_fleet,
    enroll_mqtt_node,
    start_bridge,
    write_acl,
)
from tests.control_plane.link.test_mqtt_bridge import acked_ids, batch, wire_record
from tests.edge_node.tls_support import make_pki
from tests.mqtt_support import Broker, BrokerFactory, broker_factory  # noqa: F401

pytestmark = pytest.mark.anyio

CP_USER = "edgefleet-control-plane"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def dynsec_state(path: Path, username: str = CP_USER, password: str = CP_PASSWORD) -> Path:
    """What `mosquitto_ctrl dynsec init <path> <username>` writes: one admin client."""
    _, _, iterations, salt, digest = mosquitto_password_hash(password).split("$")
    admin_acls = [
        {"acltype": acltype, "topic": "$CONTROL/dynamic-security/#", "allow": True}
        for acltype in ("publishClientSend", "publishClientReceive", "subscribePattern")
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "clients": [
                    {
                        "username": username,
                        "password": digest,
                        "salt": salt,
                        "iterations": int(iterations),
                        "roles": [{"rolename": "admin"}],
                    }
                ],
                "roles": [{"rolename": "admin", "acls": admin_acls}],
                "defaultACLAccess": {
                    "publishClientSend": False,
                    "publishClientReceive": True,
                    "subscribe": False,
                    "unsubscribe": True,
                },
            }
        )
    )
    return path


@pytest.fixture
def service_config(tmp_path: Path, sqlite_url: str) -> ServiceConfig:
    """SQLite only: the broker is under test here, not the database."""
    data = tmp_path / "server"
    return ServiceConfig(
        data_dir=data, database_url=sqlite_url, artifacts_url=(data / "artifacts").as_uri()
    )


@pytest.fixture
def dynsec_broker(broker_factory: BrokerFactory, tmp_path: Path) -> Broker:  # noqa: F811
    return broker_factory(persistence=False, dynsec=dynsec_state(tmp_path / "dynsec.json"))


def dynsec_services(service_config: ServiceConfig, broker: Broker, **bridge: object) -> Services:
    return build_services(
        dataclasses.replace(
            service_config,
            mqtt=bridge_config(broker, **bridge),
            broker_accounts="dynsec",
        )
    )


@pytest.fixture
def services(service_config: ServiceConfig, dynsec_broker: Broker) -> Iterator[Services]:
    built = dynsec_services(service_config, dynsec_broker)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture
def bridge(services: Services, dynsec_broker: Broker) -> Iterator[MqttBridge]:
    services.nodes.broker_logins.reconcile()  # the control plane's role, as at start-up
    started = start_bridge(services, bridge_config(dynsec_broker))
    yield started
    started.stop()


class Probe:
    """A raw MQTT 5 client that records its CONNACK, SUBACKs and disconnects."""

    def __init__(self, broker: Broker, username: str, password: str, client_id: str) -> None:
        self.connack: int | None = None
        self.suback: list[int] | None = None
        self.disconnects: list[int] = []
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        self.client.username_pw_set(username, password)
        self.client.on_connect = lambda _c, _u, _f, reason, _p: setattr(
            self, "connack", reason.value
        )
        self.client.on_subscribe = lambda _c, _u, _m, reasons, _p: setattr(
            self, "suback", [r.value for r in reasons]
        )
        self.client.on_disconnect = lambda _c, _u, _f, reason, _p: self.disconnects.append(
            reason.value
        )
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        self._wait(lambda: self.connack is not None, "CONNACK")

    def subscribe(self, *topics: str) -> list[int]:
        self.suback = None
        self.client.subscribe([(t, SubscribeOptions(qos=1)) for t in topics])
        self._wait(lambda: self.suback is not None, "SUBACK")
        assert self.suback is not None
        return self.suback

    def _wait(self, condition: Any, what: str) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what}")
            time.sleep(0.01)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


NOT_AUTHORIZED = 135


async def test_a_node_login_works_only_under_its_own_client_id(
    services: Services, bridge: MqttBridge, dynsec_broker: Broker
) -> None:
    fleet = create_fleet(services, "gates")
    attacker, victim = enroll_mqtt_node(services, fleet), enroll_mqtt_node(services, fleet)
    link = MqttNodeLink(victim.link_config(dynsec_broker))
    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    try:
        for stolen in (victim.node_id, bridge.client_id):
            probe = Probe(dynsec_broker, attacker.node_id, attacker.password, stolen)
            assert probe.connack == NOT_AUTHORIZED, stolen
            probe.close()
        own = Probe(dynsec_broker, attacker.node_id, attacker.password, attacker.node_id)
        assert own.connack == 0
        own.close()
        # The victim and the bridge were never dropped: both still get through.
        records = [wire_record(link_pb2.RECORD_KIND_EVENT, 1)]
        await link.send(batch(records))
        assert await acked_ids(link, {records[0].id}) == {records[0].id}
        assert bridge.counts["disconnects"] == 0 and bridge.connected
    finally:
        await link.close()


async def test_only_the_control_plane_may_take_the_shared_subscriptions(
    services: Services, bridge: MqttBridge, dynsec_broker: Broker
) -> None:
    fleet = create_fleet(services, "gates")
    thief, node = enroll_mqtt_node(services, fleet), enroll_mqtt_node(services, fleet)
    probes = [
        Probe(dynsec_broker, thief.node_id, thief.password, thief.node_id),
        Probe(dynsec_broker, CP_USER + "-not", "x", "cp-impostor"),
    ]
    assert probes[1].connack == NOT_AUTHORIZED
    refused = probes[0].subscribe(
        *(
            f"$share/edgefleet-cp/edgefleet/v1/+/+/{leaf}"
            for leaf in ("status", "health", "events")
        ),
        "edgefleet/v1/#",
        node_topic(fleet, node.node_id, Leaf.DESIRED),
    )
    assert refused == [NOT_AUTHORIZED] * 5
    # Its own downlink it may read.
    assert probes[0].subscribe(node_topic(fleet, thief.node_id, Leaf.CMD)) == [1]
    link = MqttNodeLink(node.link_config(dynsec_broker))
    await link.connect(link_pb2.Hello())
    try:
        records = [wire_record(link_pb2.RECORD_KIND_EVENT, i) for i in range(1, 9)]
        for record in records:
            await link.send(batch([record]))
        ids = {r.id for r in records}
        assert await acked_ids(link, ids) == ids
        assert services.records.count(node.node_id) == 8
    finally:
        await link.close()
        for probe in probes:
            probe.close()


async def test_revocation_removes_the_login_and_drops_the_connection(
    services: Services, dynsec_broker: Broker
) -> None:
    fleet = create_fleet(services, "gates")
    keep, gone = enroll_mqtt_node(services, fleet), enroll_mqtt_node(services, fleet)
    staying = MqttNodeLink(keep.link_config(dynsec_broker))
    leaving = MqttNodeLink(gone.link_config(dynsec_broker))
    await staying.connect(link_pb2.Hello())
    await leaving.connect(link_pb2.Hello())

    services.nodes.inventory.revoke(ADMIN, gone.node_id)
    with pytest.raises(LinkUnavailableError), anyio.fail_after(10):
        async for _ in leaving.incoming():
            pass
    with pytest.raises(LinkRefusedError):
        await leaving.connect(link_pb2.Hello())
    await staying.send(node_message(heartbeat=link_pb2.Heartbeat()))
    await staying.close()
    assert set(services.nodes.broker_logins.accounts.logins()) == {keep.node_id}
    services.nodes.inventory.revoke(ADMIN, gone.node_id)  # again: nothing left to remove


def test_an_unreachable_broker_fails_the_enrollment_and_keeps_the_token(
    service_config: ServiceConfig,
    broker_factory: BrokerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    broker = broker_factory(
        persistence=False, dynsec=dynsec_state(tmp_path / "d.json"), start=False
    )
    services = dynsec_services(service_config, broker)
    try:
        fleet = create_fleet(services, "gates")
        token, _ = services.nodes.tokens.create_bootstrap_token(
            ADMIN, fleet, {}, timedelta(hours=1)
        )
        with pytest.raises(UnavailableError, match="cannot reach the MQTT broker"):
            services.nodes.enrollment.enroll(token, make_csr(), transport="mqtt")
        with session_factory(services.engine)() as session:
            assert session.query(NodeRow).count() == 0
            (row,) = session.query(BootstrapTokenRow).all()
            assert row.used_at is None
        broker.start()
        enrolled = services.nodes.enrollment.enroll(token, make_csr(), transport="mqtt")
        assert set(services.nodes.broker_logins.accounts.logins()) == {enrolled.node_id}
    finally:
        services.close()


def test_the_reconcile_removes_repairs_and_reports(
    services: Services, dynsec_broker: Broker
) -> None:
    fleet = create_fleet(services, "gates")
    kept, revoked, unbound, lost = (enroll_mqtt_node(services, fleet) for _ in range(4))
    accounts = services.nodes.broker_logins.accounts
    assert isinstance(accounts, DynsecAccounts)
    # A revocation whose broker call never happened, a login changed by hand, a lost one,
    # an orphan from an enrollment that did not commit (old), and one that may still.
    with session_factory(services.engine)() as session:
        session.execute(
            update(NodeRow)
            .where(NodeRow.id == revoked.node_id)
            .values(revoked_at=services.clock.now())
        )
        session.commit()
    accounts._call(
        [
            {"command": "setClientId", "username": unbound.node_id, "clientid": ""},
            {
                "command": "removeClientRole",
                "username": unbound.node_id,
                "rolename": node_role(unbound.node_id),
            },
        ]
    )
    accounts.remove_node(lost.node_id)
    now = services.clock.now()
    accounts.add_node("n-0rphan000old", fleet, "pw", now=now - timedelta(hours=1))
    accounts.add_node("n-0rphan000new", fleet, "pw", now=now)

    report = services.nodes.broker_logins.reconcile()
    assert set(report.plan.remove) == {"n-0rphan000old", revoked.node_id}
    assert dict(report.plan.repair) == {unbound.node_id: fleet}
    assert report.plan.missing == (lost.node_id,)
    logins = accounts.logins()
    assert set(logins) == {kept.node_id, unbound.node_id, "n-0rphan000new"}
    assert logins[unbound.node_id].bound
    # The repaired login works again, under its own id only.
    probe = Probe(dynsec_broker, unbound.node_id, unbound.password, unbound.node_id)
    assert probe.connack == 0
    probe.close()
    assert Probe(dynsec_broker, unbound.node_id, unbound.password, "other").connack == 135
    # A second pass finds nothing to change but the node it cannot restore.
    again = services.nodes.broker_logins.reconcile()
    assert again.plan.remove == () and not again.plan.repair and not again.control_plane_changed
    assert services.nodes.broker_logins.missing == 1
    registry = fleet_registry(
        services.health.queries,
        services.health.processor,
        services.nodes.refusals,
        broker_logins=services.nodes.broker_logins,
    )
    exposed = generate_latest(registry).decode()
    assert "edgefleet_mqtt_logins_missing 1.0" in exposed
    assert "edgefleet_mqtt_reconcile_failed_passes_total 0.0" in exposed


# ------------------------------------------------- the file export, for other brokers


async def test_the_file_export_with_username_as_client_id_and_a_secret_share_group(
    service_config: ServiceConfig,
    broker_factory: BrokerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    """What the file export can guarantee on Mosquitto 2.0 (ADR 0043): with
    `use_username_as_clientid` a node's login can take no other session; its ACL file
    grants every subscription, so only an unguessable share group keeps a node from
    taking a share of the control plane's messages."""
    services = build_services(service_config)
    try:
        fleet = create_fleet(services, "gates")
        thief, node = enroll_mqtt_node(services, fleet), enroll_mqtt_node(services, fleet)
        passwd, acl = write_acl(services, tmp_path / "files")
        broker = broker_factory(
            passwd=passwd, acl=acl, persistence=False, extra=["use_username_as_clientid true"]
        )
        bridge = start_bridge(services, bridge_config(broker, share_group="cp-5f0c1e9a77d2"))
        link = MqttNodeLink(node.link_config(broker))
        await link.connect(link_pb2.Hello())
        probes = [
            Probe(broker, thief.node_id, thief.password, stolen)
            for stolen in (node.node_id, bridge.client_id)
        ]
        try:
            # Renamed to its own id: the second took the first's session, nobody else's.
            assert [p.connack for p in probes] == [0, 0]
            assert probes[-1].subscribe(
                *(f"$share/edgefleet-cp/edgefleet/v1/+/+/{leaf}" for leaf in ("health", "events"))
            ) == [1, 1]  # granted: the ACL file does not check subscriptions
            records = [wire_record(link_pb2.RECORD_KIND_EVENT, i) for i in range(1, 9)]
            for record in records:
                await link.send(batch([record]))
            ids = {r.id for r in records}
            assert await acked_ids(link, ids) == ids
            assert services.records.count(node.node_id) == 8
            assert bridge.counts["disconnects"] == 0
        finally:
            for probe in probes:
                probe.close()
            await link.close()
            bridge.stop()
    finally:
        services.close()


# ------------------------------------------------------------------- TLS to the broker


def test_the_bridge_talks_tls_with_a_client_certificate(
    service_config: ServiceConfig,
    broker_factory: BrokerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    pki = make_pki()
    files = {
        name: tmp_path / "pki" / name
        for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
    }
    (tmp_path / "pki").mkdir()
    for name, data in zip(
        files,
        (
            pki.ca_pem,
            pki.server_cert_pem,
            pki.server_key_pem,
            pki.client.certificate_pem,
            pki.client.key_pem,
        ),
        strict=True,
    ):
        files[name].write_bytes(data)
    broker = broker_factory(
        persistence=False,
        dynsec=dynsec_state(tmp_path / "dynsec.json"),
        listener=[
            f"cafile {files['ca.pem']}",
            f"certfile {files['server.pem']}",
            f"keyfile {files['server.key']}",
            "require_certificate true",
        ],
    )
    tls = {
        "tls": True,
        "ca_file": files["ca.pem"],
        "cert_file": files["client.pem"],
        "key_file": files["client.key"],
    }
    services = dynsec_services(service_config, broker, **tls)
    try:
        services.nodes.broker_logins.reconcile()  # the accounts connection over TLS too
        bridge = start_bridge(services, bridge_config(broker, **tls))
        bridge.stop()
        # Without its certificate, or without TLS at all, the broker lets it in nowhere.
        for config in (
            bridge_config(broker, tls=True, ca_file=files["ca.pem"], client_id="cp-nocert"),
            bridge_config(broker, client_id="cp-plain"),
        ):
            refused = MqttBridge(
                services.node_inbox("mqtt", auth_cache_s=0), config, data_dir=tmp_path
            )
            refused.start()
            assert not refused.wait_connected(1.5)
            refused.stop()
    finally:
        services.close()
