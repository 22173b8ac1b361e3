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
    identity.json   node id, fleet, labels; written last, so its presence means enrolled

Certificate renewal (`edge_node.identity`) stages a new pair as `node.key.next` and
`node.crt.next` and swaps them in; `EnrollmentFiles.credentials()` always answers a key
and a certificate that belong together, even in the middle of that swap.

The enrollment port authenticates the server with TLS, so the node must already trust
the fleet CA: the operator hands over `ca.crt` (the control plane's `<data dir>/ca/ca.crt`,
also served at `GET /v1/ca.pem`) together with the bootstrap token.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any, Final

import grpc
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
    "PENDING_CERT_FILE",
    "PENDING_KEY_FILE",
    "TUF_ROOT_FILE",
    "EnrollmentFiles",
    "enroll_over_grpc",
    "generate_node_key",
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
# A renewal in progress: the new key and certificate before they are swapped in.
PENDING_KEY_FILE: Final = "node.key.next"
PENDING_CERT_FILE: Final = "node.crt.next"
_MAX_DIRECTOR_KEY_BYTES: Final = 4096
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
    def director_key_path(self) -> Path:
        return self.directory / DIRECTOR_KEY_FILE

    @property
    def identity_path(self) -> Path:
        return self.directory / IDENTITY_FILE

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
    director_key = bytes(response.director_public_key)
    if director_key:
        # Checked before anything is written: a node must never trust a malformed key.
        parse_director_key(director_key)
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
    if director_key:
        atomic_write(files.director_key_path, director_key, mode=_PUBLIC_MODE)
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
