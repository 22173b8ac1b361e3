"""`MqttNodeLink` with TLS to a private Mosquitto's TLS listener: the broker's certificate
and name are checked against the CA the node was given, and a broker it cannot verify is
an outage, never a connection."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edge_node.errors import InvalidInputError
from edge_node.link.base import LinkUnavailableError
from edge_node.link.mqtt_link import MqttLinkConfig, MqttNodeLink
from protos.edgefleet.fleet.v1 import link_pb2
from tests.mqtt_support import Broker

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def write_pki(directory: Path, san: x509.GeneralName) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for `san`: (ca.pem, server.pem, server.key)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("test broker CA"))
        .issuer_name(_name("test broker CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("broker"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server.public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


class TlsBroker(Broker):
    """A private broker whose one listener speaks TLS with the given certificate."""

    def __init__(self, directory: Path, certfile: Path, keyfile: Path) -> None:
        super().__init__(directory, persistence=False)
        self.certfile, self.keyfile = certfile, keyfile

    def _write_config(self) -> None:
        super()._write_config()
        with self.config.open("a") as f:
            f.write(f"certfile {self.certfile}\nkeyfile {self.keyfile}\n")


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[tuple[Broker, Path]]:
    ca, cert, key = write_pki(tmp_path / "pki", x509.IPAddress(IPv4Address("127.0.0.1")))
    broker = TlsBroker(tmp_path / "broker", cert, key)
    broker.start()
    try:
        yield broker, ca
    finally:
        broker.kill()


def link(port: int, **tls: object) -> MqttNodeLink:
    return MqttNodeLink(
        MqttLinkConfig(
            fleet="gates",
            node_id="n-tls",
            username="n-tls",
            password="secret",
            port=port,
            connect_timeout_s=5.0,
            keepalive_s=5,
            **tls,  # type: ignore[arg-type]
        )
    )


async def test_a_node_connects_over_tls_to_the_broker_its_ca_vouches_for(
    tls_broker: tuple[Broker, Path],
) -> None:
    broker, ca = tls_broker
    node = link(broker.port, tls=True, ca_file=str(ca))
    try:
        await node.connect(link_pb2.Hello(agent_version="0.1.0"))
        assert node.stats.connects == 1
    finally:
        await node.close()


async def test_a_broker_the_node_cannot_verify_is_an_outage(
    tls_broker: tuple[Broker, Path], tmp_path: Path
) -> None:
    broker, _ = tls_broker
    other_ca, _, _ = write_pki(tmp_path / "other", x509.DNSName("elsewhere"))
    for config in ({"tls": True, "ca_file": str(other_ca)}, {"tls": True}, {}):
        node = link(broker.port, **config)
        try:
            with pytest.raises(LinkUnavailableError):
                await node.connect(link_pb2.Hello())
        finally:
            await node.close()


def test_a_ca_file_without_tls_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="set tls"):
        MqttLinkConfig(
            fleet="gates", node_id="n-1", username="n-1", password="x", ca_file="/ca.pem"
        )
