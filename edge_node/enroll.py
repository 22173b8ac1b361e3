"""Enrollment: trade a bootstrap token for a node identity, and keep it on disk.

The node makes its own key (ECDSA P-256; it never leaves the node), sends a CSR and the
single-use token to the control plane's enrollment port, and writes what comes back
into its data directory:

    node.key        the private key, mode 0600
    node.crt        its client certificate (node id in the SAN)
    ca.crt          the fleet CA: the only issuer the node trusts for the control plane
    tuf-root.json   the fleet's first TUF root, the trust anchor for models (if any yet)
    director-key.json  the director's public key (TUF key dict plus keyid): the only key
                    the node trusts for its signed assignments
    mqtt.json       an MQTT node's broker login (username = node id, password), mode 0600
    identity.json   node id, fleet, labels, transport; written last, so its presence
                    means enrolled

Certificate renewal (`edge_node.identity`) stages a new pair as `node.key.next` and
`node.crt.next` and swaps them in; `EnrollmentFiles.credentials()` always answers a key
and a certificate that belong together, even in the middle of that swap.

A gRPC node enrolls at the enrollment port (`enroll_over_grpc`), which authenticates the
server with TLS, so the node must already trust the fleet CA: the operator hands over
`ca.crt` (the control plane's `<data dir>/ca/ca.crt`, also served at `GET /v1/ca.pem`)
together with the bootstrap token. An MQTT node enrolls over the REST API
(`enroll_over_https`, `POST /v1/enroll` with transport "mqtt"): the same answer plus its
broker login, trusted because HTTPS authenticated the server (plain HTTP only to a
loopback address; see docs/adr/0016-mqtt-nodes-fetch-models-over-open-https.md).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import ssl
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import grpc
import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)
from cryptography.x509.oid import NameOID
from securesystemslib.formats import encode_canonical
from securesystemslib.signer import Key, SSlibKey

from edge_node.clock import Clock, SystemClock
from edge_node.errors import InvalidInputError, StorageError
from edge_node.fsutil import atomic_write
from edge_node.link.base import (
    LinkError,
    LinkRefusedError,
    LinkRequestError,
    LinkUnavailableError,
)
from edge_node.link.grpc_link import (
    REASON_TRAILER,
    GrpcLinkSettings,
    NodeCredentials,
    channel_options,
    link_error,
)
from protos.edgefleet.fleet.v1 import link_pb2, link_pb2_grpc

__all__ = [
    "CA_FILE",
    "CERT_FILE",
    "DIRECTOR_KEY_FILE",
    "IDENTITY_FILE",
    "KEY_FILE",
    "MQTT_FILE",
    "PENDING_CERT_FILE",
    "PENDING_KEY_FILE",
    "TUF_ROOT_FILE",
    "EnrollmentFiles",
    "MqttLogin",
    "enroll_over_grpc",
    "enroll_over_https",
    "generate_node_key",
    "http_error",
    "http_verify",
    "is_loopback_url",
    "key_matches_certificate",
    "make_csr",
    "parse_director_key",
    "private_key_pem",
]

KEY_FILE: Final = "node.key"
CERT_FILE: Final = "node.crt"
CA_FILE: Final = "ca.crt"
TUF_ROOT_FILE: Final = "tuf-root.json"
DIRECTOR_KEY_FILE: Final = "director-key.json"
IDENTITY_FILE: Final = "identity.json"
MQTT_FILE: Final = "mqtt.json"
# A renewal in progress: the new key and certificate before they are swapped in.
PENDING_KEY_FILE: Final = "node.key.next"
PENDING_CERT_FILE: Final = "node.crt.next"
_MAX_DIRECTOR_KEY_BYTES: Final = 4096
_KEY_MODE: Final = 0o600
_PUBLIC_MODE: Final = 0o644
_FORMAT_VERSION: Final = 1
_MAX_ENROLL_RESPONSE_BYTES: Final = 1 << 20
_LOOPBACK_NAMES: Final = frozenset({"localhost"})


def generate_node_key() -> ec.EllipticCurvePrivateKey:
    """P-256: what the fleet CA certifies and every TLS stack on the path negotiates."""
    return ec.generate_private_key(ec.SECP256R1())


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def make_csr(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A PEM CSR over `key`. Its subject is ignored: the control plane names the node."""
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgefleet-node")]))
        .sign(key, hashes.SHA256())
        .public_bytes(Encoding.PEM)
    )


def key_matches_certificate(key_pem: bytes, certificate_pem: bytes) -> bool:
    """Whether the certificate is for this private key; False for anything unreadable."""
    try:
        key = load_pem_private_key(key_pem, password=None)
        cert = x509.load_pem_x509_certificate(certificate_pem)
    except (ValueError, TypeError):
        return False
    der = Encoding.DER
    spki = PublicFormat.SubjectPublicKeyInfo
    return bool(
        key.public_key().public_bytes(der, spki) == cert.public_key().public_bytes(der, spki)
    )


def parse_director_key(data: bytes) -> Key:
    """The director key from its JSON form (TUF key dict plus keyid).

    The keyid must be the sha256 of the key's canonical JSON, as TUF tooling derives it:
    that binds the id the assignments name to this one key.
    """
    if len(data) > _MAX_DIRECTOR_KEY_BYTES:
        raise InvalidInputError("the director key is too large", size=len(data))
    try:
        obj = json.loads(data)
        keyid = obj.pop("keyid")
        key = SSlibKey.from_dict(str(keyid), obj)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(f"not a director key: {exc}") from exc
    canonical = encode_canonical(
        {"keytype": key.keytype, "scheme": key.scheme, "keyval": key.keyval}
    )
    assert canonical is not None  # encode_canonical returns a str without output_function
    if hashlib.sha256(canonical.encode()).hexdigest() != key.keyid:
        raise InvalidInputError(
            "the director key's keyid is not the sha256 of its canonical JSON",
            keyid=key.keyid[:64],
        )
    if key.keytype != "ed25519" or key.scheme != "ed25519":
        raise InvalidInputError(
            f"the director key is {key.keytype}/{key.scheme}; only Ed25519 is used",
            keyid=key.keyid,
        )
    return key


@dataclass(frozen=True, slots=True)
class MqttLogin:
    """An MQTT node's broker login, handed out once at enrollment."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class EnrollmentFiles:
    """An enrolled node's identity in its data directory."""

    directory: Path
    node_id: str
    fleet: str
    labels: dict[str, str] = field(default_factory=dict)
    transport: str = "grpc"
    enrolled_at: datetime | None = None

    @property
    def key_path(self) -> Path:
        return self.directory / KEY_FILE

    @property
    def cert_path(self) -> Path:
        return self.directory / CERT_FILE

    @property
    def ca_path(self) -> Path:
        return self.directory / CA_FILE

    @property
    def tuf_root_path(self) -> Path:
        return self.directory / TUF_ROOT_FILE

    @property
    def director_key_path(self) -> Path:
        return self.directory / DIRECTOR_KEY_FILE

    @property
    def identity_path(self) -> Path:
        return self.directory / IDENTITY_FILE

    @property
    def mqtt_path(self) -> Path:
        return self.directory / MQTT_FILE

    def mqtt_login(self) -> MqttLogin:
        """The broker login from enrollment; StorageError when there is none (a node
        enrolled for gRPC: enroll it again for MQTT)."""
        path = self.mqtt_path
        try:
            data = json.loads(path.read_bytes())
            return MqttLogin(username=str(data["username"]), password=str(data["password"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageError(
                f"no usable MQTT login in {path}: this node did not enroll for MQTT; "
                "enroll it again with transport mqtt",
                path=str(path),
            ) from exc

    @property
    def pending_key_path(self) -> Path:
        return self.directory / PENDING_KEY_FILE

    @property
    def pending_cert_path(self) -> Path:
        return self.directory / PENDING_CERT_FILE

    def credentials(self) -> NodeCredentials:
        """Read afresh each time, so a renewed certificate is used from the next connect.

        A renewal swaps the key in before the certificate. Between the two renames (or
        after a crash there) `node.key` is new and `node.crt` old; the new certificate is
        still staged as `node.crt.next`, and that is the one answered then.
        """
        key = self.key_path.read_bytes()
        certificate = self.cert_path.read_bytes()
        if not key_matches_certificate(key, certificate):
            try:
                staged = self.pending_cert_path.read_bytes()
            except FileNotFoundError:
                staged = b""
            if key_matches_certificate(key, staged):
                certificate = staged
            else:  # the swap finished while we read: read the pair again
                key = self.key_path.read_bytes()
                certificate = self.cert_path.read_bytes()
        return NodeCredentials(
            key_pem=key, certificate_pem=certificate, ca_pem=self.ca_path.read_bytes()
        )

    def director_key(self) -> Key:
        """The director's public key received at enrollment.

        StorageError when the file is missing or unusable (a node enrolled by an older
        control plane: re-enroll it).
        """
        path = self.director_key_path
        try:
            return parse_director_key(path.read_bytes())
        except (OSError, InvalidInputError) as exc:
            raise StorageError(f"no usable director key in {path}", path=str(path)) from exc

    @classmethod
    def load(cls, directory: Path) -> EnrollmentFiles:
        """The identity enrolled into `directory`; StorageError if there is none."""
        path = Path(directory) / IDENTITY_FILE
        try:
            data: dict[str, Any] = json.loads(path.read_bytes())
            enrolled_at = data.get("enrolled_at")
            return cls(
                directory=Path(directory),
                node_id=str(data["node_id"]),
                fleet=str(data["fleet"]),
                labels={str(k): str(v) for k, v in dict(data.get("labels", {})).items()},
                transport=str(data.get("transport") or "grpc"),
                enrolled_at=None if enrolled_at is None else datetime.fromisoformat(enrolled_at),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"no usable node identity in {path}", path=str(path)) from exc


async def enroll_over_grpc(
    enroll_address: str,
    ca_pem: bytes,
    token: str,
    agent_version: str,
    data_dir: Path,
    *,
    server_name: str | None = None,
    timeout_s: float = 30.0,
    clock: Clock | None = None,
) -> EnrollmentFiles:
    """Enroll at the control plane's enrollment port and write the identity files.

    Raises `LinkRefusedError` for a token that is unknown, expired or used,
    `LinkUnavailableError` when the port cannot be reached, and `InvalidInputError`
    when `data_dir` already holds an identity (enrolling again would burn the token
    and orphan the node id on record).
    """
    data_dir = Path(data_dir)
    if (data_dir / IDENTITY_FILE).exists():
        raise InvalidInputError(
            f"{data_dir} already holds an enrolled node; use another directory",
            path=str(data_dir),
        )
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = generate_node_key()
    request = link_pb2.EnrollRequest(
        bootstrap_token=token,
        csr_pem=make_csr(key),
        agent_version=agent_version,
        transport="grpc",
    )
    settings = GrpcLinkSettings(target=enroll_address, server_name=server_name)
    async with grpc.aio.secure_channel(
        enroll_address,
        grpc.ssl_channel_credentials(root_certificates=ca_pem),
        options=channel_options(settings),
    ) as channel:
        try:
            response: link_pb2.EnrollResponse = await link_pb2_grpc.NodeLinkStub(channel).Enroll(
                request, timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            reason = dict(exc.trailing_metadata() or ()).get(REASON_TRAILER)
            raise link_error(exc.code(), exc.details(), reason=reason, request=True) from exc
    return _write_identity(
        data_dir,
        key,
        _Enrolled(
            node_id=response.node_id,
            fleet=response.fleet,
            labels=dict(response.labels),
            certificate_pem=bytes(response.certificate_pem),
            ca_pem=bytes(response.ca_pem),
            tuf_root=bytes(response.tuf_root),
            director_key=bytes(response.director_public_key),
            not_after=response.not_after.ToDatetime(tzinfo=UTC),
        ),
        transport="grpc",
        clock=clock,
    )


@dataclass(frozen=True, slots=True)
class _Enrolled:
    """What an enrollment answered, whichever way it came."""

    node_id: str
    fleet: str
    labels: dict[str, str]
    certificate_pem: bytes
    ca_pem: bytes
    tuf_root: bytes
    director_key: bytes
    not_after: datetime
    mqtt: MqttLogin | None = None


def _write_identity(
    data_dir: Path,
    key: ec.EllipticCurvePrivateKey,
    enrolled: _Enrolled,
    *,
    transport: str,
    clock: Clock | None,
) -> EnrollmentFiles:
    if enrolled.director_key:
        # Checked before anything is written: a node must never trust a malformed key.
        parse_director_key(enrolled.director_key)
    files = EnrollmentFiles(
        directory=data_dir,
        node_id=enrolled.node_id,
        fleet=enrolled.fleet,
        labels=enrolled.labels,
        transport=transport,
        enrolled_at=(clock or SystemClock()).now(),
    )
    atomic_write(files.key_path, private_key_pem(key), mode=_KEY_MODE)
    atomic_write(files.cert_path, enrolled.certificate_pem, mode=_PUBLIC_MODE)
    atomic_write(files.ca_path, enrolled.ca_pem, mode=_PUBLIC_MODE)
    if enrolled.tuf_root:
        atomic_write(files.tuf_root_path, enrolled.tuf_root, mode=_PUBLIC_MODE)
    if enrolled.director_key:
        atomic_write(files.director_key_path, enrolled.director_key, mode=_PUBLIC_MODE)
    if enrolled.mqtt is not None:
        login = {"username": enrolled.mqtt.username, "password": enrolled.mqtt.password}
        atomic_write(files.mqtt_path, json.dumps(login).encode() + b"\n", mode=_KEY_MODE)
    assert files.enrolled_at is not None
    identity = {
        "format_version": _FORMAT_VERSION,
        "node_id": files.node_id,
        "fleet": files.fleet,
        "labels": files.labels,
        "transport": transport,
        "certificate_not_after": enrolled.not_after.isoformat(),
        "enrolled_at": files.enrolled_at.isoformat(),
    }
    atomic_write(
        files.identity_path,
        json.dumps(identity, indent=2, sort_keys=True).encode() + b"\n",
        mode=_PUBLIC_MODE,
    )
    return files


def is_loopback_url(url: str) -> bool:
    """Whether `url`'s host is this machine (localhost, 127.0.0.0/8, ::1)."""
    host = httpx.URL(url).host
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def http_verify(ca_file: Path | None) -> ssl.SSLContext | bool:
    """TLS verification for the control plane's HTTPS API: the system's trust store, or
    only the CAs in `ca_file` (a PEM bundle) when given."""
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInputError(
            f"cannot use {ca_file} as the HTTPS CA bundle: {exc}", path=str(ca_file)
        ) from exc


def http_error(response: httpx.Response, what: str) -> LinkError:
    """The link error for a refused HTTP request (RFC 9457 problem details, if any)."""
    reason: str | None = None
    detail = response.reason_phrase
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if isinstance(problem, dict):
        reason = str(problem["reason"]) if problem.get("reason") else None
        detail = str(problem.get("detail") or problem.get("title") or detail)[:300]
    code = response.status_code
    message = f"{what}: HTTP {code}: {detail}"
    if code in (401, 403):
        return LinkRefusedError(message, reason=reason, status=code)
    if code >= 500 or code in (408, 429):
        return LinkUnavailableError(message, reason=reason, status=code)
    return LinkRequestError(message, reason=reason, status=code)


async def enroll_over_https(
    base_url: str,
    token: str,
    agent_version: str,
    data_dir: Path,
    *,
    transport: str = "mqtt",
    http_ca_file: Path | None = None,
    fleet_ca_pem: bytes | None = None,
    timeout_s: float = 30.0,
    clock: Clock | None = None,
    http_transport: httpx.AsyncBaseTransport | None = None,
) -> EnrollmentFiles:
    """Enroll with `POST {base_url}/v1/enroll` and write the identity files.

    `base_url` must be HTTPS (verified against the system's CAs, or `http_ca_file`);
    plain HTTP only to a loopback address: the answer carries the trust anchors (fleet
    CA, TUF root, director key). With `fleet_ca_pem` (the fleet CA the operator handed
    over), an answer naming another CA is refused before anything is written. For
    transport "mqtt" the broker login is kept in `mqtt.json` (0600).

    Raises `LinkRefusedError` for a token that is unknown, expired or used (HTTP 401),
    `LinkUnavailableError` when the API cannot be reached or answers 5xx,
    `LinkRequestError` for another refusal, and `InvalidInputError` for an unsafe URL,
    an answer that is not an enrollment, or a `data_dir` already enrolled.
    """
    url = httpx.URL(base_url)
    if url.scheme != "https" and not (url.scheme == "http" and is_loopback_url(base_url)):
        raise InvalidInputError(
            f"{base_url} is not an https:// URL (plain http only to a loopback address): "
            "the enrollment answer carries the node's trust anchors",
            url=base_url,
        )
    data_dir = Path(data_dir)
    if (data_dir / IDENTITY_FILE).exists():
        raise InvalidInputError(
            f"{data_dir} already holds an enrolled node; use another directory",
            path=str(data_dir),
        )
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = generate_node_key()
    body = {
        "token": token,
        "csr_pem": make_csr(key).decode("ascii"),
        "agent_version": agent_version,
        "transport": transport,
    }
    try:
        async with httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            verify=http_verify(http_ca_file),
            timeout=timeout_s,
            follow_redirects=False,
            transport=http_transport,
        ) as http:
            response = await http.post("/v1/enroll", json=body)
    except httpx.TransportError as exc:
        raise LinkUnavailableError(f"cannot reach {base_url}: {exc}") from exc
    if response.status_code != 201:
        raise http_error(response, "enrollment refused")
    if len(response.content) > _MAX_ENROLL_RESPONSE_BYTES:
        raise InvalidInputError("the enrollment answer is too large", size=len(response.content))
    enrolled = _parse_rest_enrollment(response, transport)
    if fleet_ca_pem is not None and not _same_certificate(fleet_ca_pem, enrolled.ca_pem):
        raise LinkRefusedError(
            f"{base_url} answered with another fleet CA than the one given (ca_file): "
            "wrong server, or the wrong CA file",
            reason="ca-mismatch",
        )
    return _write_identity(data_dir, key, enrolled, transport=transport, clock=clock)


def _parse_rest_enrollment(response: httpx.Response, transport: str) -> _Enrolled:
    try:
        data = response.json()
        mqtt = None
        if transport == "mqtt":
            username, password = data.get("mqtt_username"), data.get("mqtt_password")
            if not (isinstance(username, str) and isinstance(password, str)):
                raise ValueError("no MQTT login in the answer")
            if not (username and password):
                raise ValueError("an empty MQTT login in the answer")
            mqtt = MqttLogin(username, password)
        root = data.get("tuf_root")
        return _Enrolled(
            node_id=str(data["node_id"]),
            fleet=str(data["fleet"]),
            labels={str(k): str(v) for k, v in dict(data.get("labels") or {}).items()},
            certificate_pem=str(data["certificate_pem"]).encode("ascii"),
            ca_pem=str(data["ca_pem"]).encode("ascii"),
            tuf_root=b"" if not root else str(root).encode("utf-8"),
            director_key=json.dumps(data["director_public_key"], sort_keys=True).encode(),
            not_after=datetime.fromisoformat(str(data["not_after"])),
            mqtt=mqtt,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(f"not an enrollment answer: {exc}") from exc


def _same_certificate(a_pem: bytes, b_pem: bytes) -> bool:
    try:
        a = x509.load_pem_x509_certificate(a_pem)
        b = x509.load_pem_x509_certificate(b_pem)
    except ValueError:
        return False
    return a == b
