"""The control plane's certificate authority: it certifies nodes (mTLS clients) and the
gRPC server, and tells which node a presented client certificate belongs to.

Key and certificate live in two files under one directory, created once on first start.
No database access and no policy about *which* node may enroll: that is
`control_plane.nodes`. The CA alone decides what goes into a certificate; a CSR only
contributes its public key and the proof that the requester holds the private key.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from control_plane.errors import AuthenticationError, InvalidInputError, PolicyError
from control_plane.fsutil import atomic_write, make_private_dirs
from control_plane.trust.keys import PRIVATE_MODE, PUBLIC_MODE, check_private_key_mode

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "CertificateAuthority",
    "CertificateRejectedError",
    "InvalidCsrError",
    "IssuedCert",
    "NodeIdentity",
    "ServerCredentials",
    "node_urn",
    "parse_node_urn",
    "serial_hex",
]

log = logging.getLogger(__name__)

CA_KEY_FILE: Final = "ca.key"
CA_CERT_FILE: Final = "ca.crt"
CA_VALIDITY: Final = timedelta(days=3650)
# Certificates start a little in the past so a node whose clock lags accepts them.
CLOCK_SKEW: Final = timedelta(minutes=5)
MAX_CSR_BYTES: Final = 16 * 1024
MAX_CERT_BYTES: Final = 16 * 1024
RSA_MIN_BITS: Final = 2048
RSA_MAX_BITS: Final = 8192  # bounded: a huge modulus is a cheap way to burn our CPU
ALLOWED_CURVES: Final = (ec.SECP256R1, ec.SECP384R1)
CA_EXPIRY_WARNING: Final = timedelta(days=90)

NODE_URN_PREFIX: Final = "urn:edgefleet:node:"
_FLEET = r"[a-z0-9][a-z0-9-]{0,62}"
_NODE_ID = r"[a-z0-9][a-z0-9._-]{0,63}"
_NODE_URN = re.compile(rf"urn:edgefleet:node:(?P<fleet>{_FLEET}):(?P<node_id>{_NODE_ID})")
_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


class InvalidCsrError(InvalidInputError):
    """A CSR that is malformed, wrongly signed or carries a key we do not certify."""

    title = "invalid certificate signing request"


class CertificateRejectedError(AuthenticationError):
    """A presented certificate that does not prove a node identity issued by this CA."""

    title = "certificate refused"


@dataclass(frozen=True, slots=True)
class IssuedCert:
    pem: bytes
    serial: str  # lowercase hex, 40 digits: what the inventory stores and compares
    not_after: datetime
    public_key_sha256: str  # of the certified SubjectPublicKeyInfo (DER)


@dataclass(frozen=True, slots=True)
class ServerCredentials:
    """A server certificate with the private key the CA generated for it."""

    certificate_pem: bytes
    private_key_pem: bytes = field(repr=False)
    serial: str
    not_after: datetime


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Who a verified client certificate speaks for."""

    fleet: str
    node_id: str
    serial: str
    not_after: datetime


def serial_hex(serial: int) -> str:
    return f"{serial:040x}"


def node_urn(fleet: str, node_id: str) -> str:
    urn = f"{NODE_URN_PREFIX}{fleet}:{node_id}"
    if not _NODE_URN.fullmatch(urn):
        raise InvalidInputError(
            f"cannot name node {node_id!r} of fleet {fleet!r} in a certificate",
            fleet=fleet,
            node_id=node_id,
        )
    return urn


def parse_node_urn(uri: str) -> tuple[str, str] | None:
    """(fleet, node id) from `urn:edgefleet:node:<fleet>:<node id>`, or None."""
    match = _NODE_URN.fullmatch(uri)
    return (match["fleet"], match["node_id"]) if match else None


class CertificateAuthority:
    """Issues node client certificates and server certificates; verifies node certificates.

    The key is ECDSA P-256, not Ed25519: gRPC's TLS stack (BoringSSL) and many
    embedded TLS libraries negotiate Ed25519 client certificates poorly or not at all,
    while P-256 works everywhere; the CA key signs the leaves, so it must match what
    the peers can verify.
    """

    def __init__(self, private_key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate):
        if private_key.public_key() != certificate.public_key():
            raise PolicyError("the CA certificate does not belong to the CA key")
        self._key = private_key
        self._cert = certificate
        self._store = Store([certificate])
        self._ski = x509.SubjectKeyIdentifier.from_public_key(private_key.public_key())

    # ---------------------------------------------------------------- creation

    @classmethod
    def load_or_create(
        cls,
        directory: Path,
        *,
        now: datetime,
        common_name: str = "edgefleet fleet CA",
    ) -> CertificateAuthority:
        """The CA in `directory` (`ca.key` 0600, `ca.crt`), created on first use.

        Safe when several processes start at once on a shared directory: each file is
        created exclusively, the first writer wins and the others load its file; a crash
        between the two files is healed by the next start (the certificate is made
        again from the surviving key).
        """
        directory = Path(directory)
        make_private_dirs(directory)
        key = _load_or_create_key(directory / CA_KEY_FILE)
        cert = _load_or_create_cert(directory / CA_CERT_FILE, key, now, common_name)
        ca = cls(key, cert)
        if ca.not_after - now < CA_EXPIRY_WARNING:
            log.warning(
                "the fleet CA certificate expires soon; rotate it",
                extra={"ca_not_after": ca.not_after.isoformat()},
            )
        return ca

    # -------------------------------------------------------------- properties

    @property
    def certificate(self) -> x509.Certificate:
        return self._cert

    @property
    def ca_pem(self) -> bytes:
        return self._cert.public_bytes(Encoding.PEM)

    @property
    def not_after(self) -> datetime:
        return self._cert.not_valid_after_utc

    # ----------------------------------------------------------------- issuing

    @staticmethod
    def check_csr(csr_pem: bytes) -> str:
        """Verify a CSR's signature and key type; returns the sha256 of its public key."""
        return _public_key_sha256(_load_csr(csr_pem).public_key())

    def issue_node_certificate(
        self,
        csr_pem: bytes,
        *,
        node_id: str,
        fleet: str,
        now: datetime,
        ttl: timedelta = timedelta(days=7),
    ) -> IssuedCert:
        """A short-lived mTLS client certificate for `node_id` over the CSR's public key.

        The CSR's subject and extensions are ignored: CN is the node id and the only
        SAN is `urn:edgefleet:node:<fleet>:<node id>`, which is what
        `node_identity_from_certificate` trusts.
        """
        csr = _load_csr(csr_pem)
        urn = node_urn(fleet, node_id)
        public_key = csr.public_key()
        builder = (
            self._leaf_builder(public_key, now, ttl)
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(urn)]), critical=False
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        )
        cert = builder.sign(self._key, hashes.SHA256())
        return IssuedCert(
            pem=cert.public_bytes(Encoding.PEM),
            serial=serial_hex(cert.serial_number),
            not_after=cert.not_valid_after_utc,
            public_key_sha256=_public_key_sha256(public_key),
        )

    def issue_server_certificate(
        self,
        hostnames: list[str],
        ips: list[str],
        *,
        now: datetime,
        ttl: timedelta = timedelta(days=365),
    ) -> ServerCredentials:
        """A serverAuth certificate (and a fresh P-256 key) for the gRPC endpoint."""
        names: list[x509.GeneralName] = []
        for host in hostnames:
            if not _HOSTNAME.fullmatch(host):
                raise InvalidInputError(f"{host!r} is not a DNS name", hostname=host)
            names.append(x509.DNSName(host.lower()))
        for text in ips:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(text)))
            except ValueError as exc:
                raise InvalidInputError(f"{text!r} is not an IP address", ip=text) from exc
        if not names:
            raise InvalidInputError("a server certificate needs at least one hostname or IP")
        key = ec.generate_private_key(ec.SECP256R1())
        common_name = hostnames[0] if hostnames else ips[0]
        cert = (
            self._leaf_builder(key.public_key(), now, ttl)
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return ServerCredentials(
            certificate_pem=cert.public_bytes(Encoding.PEM),
            private_key_pem=key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()),
            serial=serial_hex(cert.serial_number),
            not_after=cert.not_valid_after_utc,
        )

    def _leaf_builder(
        self, public_key: CertificatePublicKeyTypes, now: datetime, ttl: timedelta
    ) -> x509.CertificateBuilder:
        if ttl <= timedelta(0):
            raise InvalidInputError("a certificate lifetime must be positive", ttl_s=ttl.seconds)
        # A leaf never outlives the CA that vouches for it.
        not_after = min(now + ttl, self.not_after)
        return (
            x509.CertificateBuilder()
            .issuer_name(self._cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(digital_signature=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self._ski),
                critical=False,
            )
        )

    # --------------------------------------------------------------- verifying

    def node_identity_from_certificate(self, certificate: bytes, *, now: datetime) -> NodeIdentity:
        """The node a client certificate (PEM or DER) speaks for, if this CA issued it.

        Refuses (CertificateRejectedError, with a `reason`) a certificate that is
        malformed, expired or not yet valid, not signed by this CA, not a client
        certificate, or without exactly one node URN. Pure: no revocation check here;
        `NodeAuthentication.authorize` compares the serial with the inventory.
        """
        cert = _load_certificate(certificate)
        serial = serial_hex(cert.serial_number)
        valid_from, valid_until = cert.not_valid_before_utc, cert.not_valid_after_utc
        if now < valid_from or now > valid_until:
            raise CertificateRejectedError(
                f"certificate {serial} is outside its validity period "
                f"({valid_from.isoformat()} .. {valid_until.isoformat()})",
                reason="cert-expired",
                serial=serial,
            )
        try:
            cert.verify_directly_issued_by(self._cert)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise CertificateRejectedError(
                f"certificate {serial} was not issued by this control plane's CA",
                reason="cert-unknown-issuer",
                serial=serial,
            ) from exc
        try:
            # The full RFC 5280 client-path check (key usage, EKU clientAuth, basic
            # constraints) by cryptography's own verifier, not by hand.
            verifier = PolicyBuilder().store(self._store).time(now).build_client_verifier()
            verified = verifier.verify(cert, [])
        except VerificationError as exc:
            raise CertificateRejectedError(
                f"certificate {serial} is not a valid client certificate: {exc}",
                reason="cert-invalid",
                serial=serial,
            ) from exc
        identities = {
            parsed
            for name in verified.subjects or []
            if isinstance(name, x509.UniformResourceIdentifier)
            and (parsed := parse_node_urn(name.value)) is not None
        }
        if len(identities) != 1:
            raise CertificateRejectedError(
                f"certificate {serial} does not name exactly one node",
                reason="cert-no-identity",
                serial=serial,
            )
        fleet, node_id = identities.pop()
        return NodeIdentity(
            fleet=fleet, node_id=node_id, serial=serial, not_after=cert.not_valid_after_utc
        )


# ------------------------------------------------------------------ helpers


def _key_usage(*, digital_signature: bool = False, cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _public_key_sha256(key: object) -> str:
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise InvalidCsrError("unsupported public key type", reason="csr-key-type")
    der = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _load_csr(csr_pem: bytes) -> x509.CertificateSigningRequest:
    if not isinstance(csr_pem, bytes):
        raise InvalidCsrError("a CSR must be PEM bytes", reason="csr-malformed")
    if len(csr_pem) > MAX_CSR_BYTES:
        raise InvalidCsrError(
            f"the CSR is over {MAX_CSR_BYTES} bytes", reason="csr-malformed", limit=MAX_CSR_BYTES
        )
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
        public_key = csr.public_key()
        signature_ok = csr.is_signature_valid
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidCsrError(
            "not a PEM certificate signing request (PKCS#10)", reason="csr-malformed"
        ) from exc
    if isinstance(public_key, rsa.RSAPublicKey):
        if not RSA_MIN_BITS <= public_key.key_size <= RSA_MAX_BITS:
            raise InvalidCsrError(
                f"RSA keys must have {RSA_MIN_BITS}-{RSA_MAX_BITS} bits, "
                f"not {public_key.key_size}; ECDSA P-256 is preferred",
                reason="csr-key-type",
            )
    elif isinstance(public_key, ec.EllipticCurvePublicKey):
        if not isinstance(public_key.curve, ALLOWED_CURVES):
            raise InvalidCsrError(
                f"curve {public_key.curve.name} is not accepted; use P-256",
                reason="csr-key-type",
            )
    else:
        raise InvalidCsrError(
            f"{type(public_key).__name__.removeprefix('_')} keys are not accepted "
            "for node certificates; use ECDSA P-256",
            reason="csr-key-type",
        )
    if not signature_ok:
        # The self-signature proves the requester holds the private key.
        raise InvalidCsrError("the CSR's signature does not verify", reason="csr-bad-signature")
    return csr


def _load_certificate(data: bytes) -> x509.Certificate:
    if not isinstance(data, bytes) or len(data) > MAX_CERT_BYTES:
        raise CertificateRejectedError("not a certificate", reason="cert-malformed")
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise CertificateRejectedError("not an X.509 certificate", reason="cert-malformed") from exc


def _load_or_create_key(path: Path) -> ec.EllipticCurvePrivateKey:
    if not path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        try:
            atomic_write(path, pem, mode=PRIVATE_MODE, exclusive=True)
            return key
        except FileExistsError:
            pass  # another process created it first: use theirs, never replace it
    check_private_key_mode(path)
    loaded = load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey) or not isinstance(
        loaded.curve, ec.SECP256R1
    ):
        raise PolicyError(f"{path} is not an ECDSA P-256 private key", path=str(path))
    return loaded


def _load_or_create_cert(
    path: Path, key: ec.EllipticCurvePrivateKey, now: datetime, common_name: str
) -> x509.Certificate:
    if not path.exists():
        cert = _self_signed(key, now, common_name)
        try:
            atomic_write(path, cert.public_bytes(Encoding.PEM), mode=PUBLIC_MODE, exclusive=True)
            return cert
        except FileExistsError:
            pass
    try:
        loaded = x509.load_pem_x509_certificate(path.read_bytes())
    except ValueError as exc:
        raise PolicyError(f"{path} is not a PEM certificate", path=str(path)) from exc
    if loaded.public_key() != key.public_key():
        raise PolicyError(
            f"{path} does not belong to the key in {path.with_name(CA_KEY_FILE)}", path=str(path)
        )
    return loaded


def _self_signed(
    key: ec.EllipticCurvePrivateKey, now: datetime, common_name: str
) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edgefleet"),
        ]
    )
    public_key = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_VALIDITY)
        # path_length=0: this CA signs leaves only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(digital_signature=True, cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )
