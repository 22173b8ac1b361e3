"""Enrollment: trade a bootstrap token for a node identity, and keep it on disk.

The node makes its own key (ECDSA P-256; it never leaves the node), sends a CSR and the
single-use token to the control plane's enrollment port, and writes what comes back
into its data directory:

    node.key        the private key, mode 0600
    node.crt        its client certificate (node id in the SAN)
    ca.crt          the fleet CA: the only issuer the node trusts for the control plane
    tuf-root.json   the fleet's first TUF root, the trust anchor for models (if any yet)
    identity.json   node id, fleet, labels; written last, so its presence means enrolled

The enrollment port authenticates the server with TLS, so the node must already trust
the fleet CA: the operator hands over `ca.crt` (the control plane's `<data dir>/ca/ca.crt`,
also served at `GET /v1/ca.pem`) together with the bootstrap token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any, Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import NameOID

from edge_node.clock import Clock, SystemClock
from edge_node.errors import InvalidInputError, StorageError
from edge_node.fsutil import atomic_write
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
    "IDENTITY_FILE",
    "KEY_FILE",
    "TUF_ROOT_FILE",
    "EnrollmentFiles",
    "enroll_over_grpc",
    "generate_node_key",
    "make_csr",
    "private_key_pem",
]

KEY_FILE: Final = "node.key"
CERT_FILE: Final = "node.crt"
CA_FILE: Final = "ca.crt"
TUF_ROOT_FILE: Final = "tuf-root.json"
IDENTITY_FILE: Final = "identity.json"
_KEY_MODE: Final = 0o600
_PUBLIC_MODE: Final = 0o644
_FORMAT_VERSION: Final = 1


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


@dataclass(frozen=True, slots=True)
class EnrollmentFiles:
    """An enrolled node's identity in its data directory."""

    directory: Path
    node_id: str
    fleet: str
    labels: dict[str, str] = field(default_factory=dict)

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
    def identity_path(self) -> Path:
        return self.directory / IDENTITY_FILE

    def credentials(self) -> NodeCredentials:
        """Read afresh each time, so a renewed certificate is used from the next connect."""
        return NodeCredentials(
            key_pem=self.key_path.read_bytes(),
            certificate_pem=self.cert_path.read_bytes(),
            ca_pem=self.ca_path.read_bytes(),
        )

    @classmethod
    def load(cls, directory: Path) -> EnrollmentFiles:
        """The identity enrolled into `directory`; StorageError if there is none."""
        path = Path(directory) / IDENTITY_FILE
        try:
            data: dict[str, Any] = json.loads(path.read_bytes())
            return cls(
                directory=Path(directory),
                node_id=str(data["node_id"]),
                fleet=str(data["fleet"]),
                labels={str(k): str(v) for k, v in dict(data.get("labels", {})).items()},
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
    files = EnrollmentFiles(
        directory=data_dir,
        node_id=response.node_id,
        fleet=response.fleet,
        labels=dict(response.labels),
    )
    atomic_write(files.key_path, private_key_pem(key), mode=_KEY_MODE)
    atomic_write(files.cert_path, bytes(response.certificate_pem), mode=_PUBLIC_MODE)
    atomic_write(files.ca_path, bytes(response.ca_pem), mode=_PUBLIC_MODE)
    if response.tuf_root:
        atomic_write(files.tuf_root_path, bytes(response.tuf_root), mode=_PUBLIC_MODE)
    identity = {
        "format_version": _FORMAT_VERSION,
        "node_id": files.node_id,
        "fleet": files.fleet,
        "labels": files.labels,
        "certificate_not_after": response.not_after.ToDatetime(tzinfo=UTC).isoformat(),
        "enrolled_at": (clock or SystemClock()).now().isoformat(),
    }
    atomic_write(
        files.identity_path,
        json.dumps(identity, indent=2, sort_keys=True).encode() + b"\n",
        mode=_PUBLIC_MODE,
    )
    return files
