"""A throwaway CA with a server and a client certificate, for the node's TLS tests.

Made here with `cryptography`, so the edge node's tests need nothing of the control plane.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edge_node.link.grpc_link import NodeCredentials


@dataclass(frozen=True)
class Pki:
    ca_pem: bytes
    server_key_pem: bytes
    server_cert_pem: bytes
    client: NodeCredentials


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    san: list[x509.GeneralName] | None = None,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = datetime.now(UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki() -> Pki:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test CA", ca_key, None, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _cert(
        "localhost",
        server_key,
        ca,
        ca_key,
        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _cert("n-test", client_key, ca, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    ca_pem = ca.public_bytes(Encoding.PEM)
    return Pki(
        ca_pem=ca_pem,
        server_key_pem=_pem(server_key),
        server_cert_pem=server.public_bytes(Encoding.PEM),
        client=NodeCredentials(_pem(client_key), client.public_bytes(Encoding.PEM), ca_pem),
    )
