"""Enrollment over HTTPS (MQTT nodes) against a fake `POST /v1/enroll`, and the login
grace that lets a freshly enrolled MQTT node wait for the broker to learn its login."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from securesystemslib.signer import CryptoSigner

from edge_node.agent.transport import BrokerLoginRefusedError, LoginGrace
from edge_node.enroll import EnrollmentFiles, enroll_over_https
from edge_node.errors import InvalidInputError
from edge_node.link.base import (
    LinkRefusedError,
    LinkRequestError,
    LinkUnavailableError,
    NodeLink,
)
from protos.edgefleet.fleet.v1 import link_pb2

pytestmark = pytest.mark.anyio

BASE = "https://cp.example.com"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def self_signed(name: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


FLEET_CA = self_signed("fleet CA")
DIRECTOR = CryptoSigner.generate_ed25519()


def answer(**changes: Any) -> dict[str, Any]:
    body = {
        "node_id": "n-0a1b2c3d4e5f",
        "fleet": "gates",
        "labels": {"site": "north"},
        "certificate_pem": self_signed("n-0a1b2c3d4e5f").decode(),
        "ca_pem": FLEET_CA.decode(),
        "cert_serial": "1",
        "not_after": (datetime.now(UTC) + timedelta(days=7)).isoformat(),
        "mqtt_username": "n-0a1b2c3d4e5f",
        "mqtt_password": "s3cret",
        "director_public_key": {
            "keyid": DIRECTOR.public_key.keyid,
            **DIRECTOR.public_key.to_dict(),
        },
        "tuf_root": '{"signed": {"_type": "root"}}',
    }
    return body | changes


def server(status: int, body: dict[str, Any], seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


async def test_an_mqtt_node_keeps_its_broker_login_owner_only(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    files = await enroll_over_https(
        BASE,
        "tok",
        "0.1.0",
        tmp_path / "node",
        fleet_ca_pem=FLEET_CA,
        http_transport=server(201, answer(), seen),
    )
    sent = json.loads(seen[0].content)
    assert (str(seen[0].url), sent["transport"], sent["token"]) == (
        f"{BASE}/v1/enroll",
        "mqtt",
        "tok",
    )
    assert "BEGIN CERTIFICATE REQUEST" in sent["csr_pem"]
    assert files.mqtt_path.stat().st_mode & 0o777 == 0o600
    assert files.key_path.stat().st_mode & 0o777 == 0o600
    login = files.mqtt_login()
    assert (login.username, login.password) == ("n-0a1b2c3d4e5f", "s3cret")
    assert "s3cret" not in repr(login)
    assert files.tuf_root_path.read_text() == '{"signed": {"_type": "root"}}'
    assert files.director_key() == DIRECTOR.public_key
    loaded = EnrollmentFiles.load(tmp_path / "node")
    assert (loaded.node_id, loaded.transport, loaded.labels) == (
        "n-0a1b2c3d4e5f",
        "mqtt",
        {"site": "north"},
    )
    assert loaded.enrolled_at is not None


async def test_a_gRPC_node_has_no_broker_login(tmp_path: Path) -> None:
    files = EnrollmentFiles(directory=tmp_path, node_id="n-1", fleet="gates")
    with pytest.raises(Exception, match="did not enroll for MQTT"):
        files.mqtt_login()


async def test_plain_http_to_another_machine_is_refused_before_sending(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    with pytest.raises(InvalidInputError, match="not an https"):
        await enroll_over_https(
            "http://cp.example.com",
            "tok",
            "0.1.0",
            tmp_path / "node",
            http_transport=server(201, answer(), seen),
        )
    assert seen == []
    assert not (tmp_path / "node").exists()


async def test_another_fleet_ca_in_the_answer_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(LinkRefusedError, match="another fleet CA") as refused:
        await enroll_over_https(
            BASE,
            "tok",
            "0.1.0",
            tmp_path / "node",
            fleet_ca_pem=self_signed("someone else"),
            http_transport=server(201, answer(), []),
        )
    assert refused.value.fields["reason"] == "ca-mismatch"
    assert not (tmp_path / "node" / "identity.json").exists()
    assert not (tmp_path / "node" / "mqtt.json").exists()


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (401, {"title": "authentication required", "reason": "token-used"}, LinkRefusedError),
        (503, {"title": "unavailable"}, LinkUnavailableError),
        (422, {"title": "invalid"}, LinkRequestError),
    ],
)
async def test_refusals_and_outages(
    tmp_path: Path, status: int, body: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error) as raised:
        await enroll_over_https(
            BASE, "tok", "0.1.0", tmp_path / "node", http_transport=server(status, body, [])
        )
    assert getattr(raised.value, "fields", {}).get("reason") == body.get("reason")
    assert not (tmp_path / "node" / "identity.json").exists()


async def test_an_answer_without_the_broker_login_is_not_an_enrollment(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="not an enrollment"):
        await enroll_over_https(
            BASE,
            "tok",
            "0.1.0",
            tmp_path / "node",
            http_transport=server(201, answer(mqtt_password=None), []),
        )
    assert not (tmp_path / "node" / "identity.json").exists()


# ---------------------------------------------------------------- login grace


class Refusing(NodeLink):
    def __init__(self) -> None:
        self.connects = 0

    async def connect(self, hello: link_pb2.Hello) -> None:
        self.connects += 1
        raise LinkRefusedError("the broker refused the connection: Not authorized")

    async def send(self, message: link_pb2.NodeMessage) -> None:
        raise AssertionError

    def incoming(self) -> AsyncIterator[link_pb2.ControlMessage]:
        raise AssertionError

    async def fetch_metadata(self, filename: str) -> bytes:
        raise AssertionError

    def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        raise AssertionError

    async def close(self) -> None:
        pass


class Clock:
    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


async def test_refusals_are_outages_within_the_grace_then_final() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    clock = Clock(start)
    grace = LoginGrace(Refusing(), clock, start + timedelta(hours=1), node_id="n-1")
    with pytest.raises(LinkUnavailableError, match="login grace"):
        await grace.connect(link_pb2.Hello())
    assert grace.refusals_forgiven == 1
    clock.at = start + timedelta(hours=1)
    with pytest.raises(BrokerLoginRefusedError, match="Not authorized") as final:
        await grace.connect(link_pb2.Hello())
    assert "n-1" in final.value.message
    assert isinstance(final.value, LinkRefusedError)  # final: the agent exits 3
    assert grace.refusals_forgiven == 1
