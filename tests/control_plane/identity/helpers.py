"""CSRs made the way a node makes them: its own key, whatever subject it likes."""

from __future__ import annotations

import base64

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

NodeKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def make_csr(
    key: NodeKey | None = None,
    *,
    common_name: str = "node",
    san_uris: tuple[str, ...] = (),
) -> bytes:
    key = key if key is not None else new_key()
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    )
    if san_uris:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in san_uris]),
            critical=False,
        )
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm).public_bytes(Encoding.PEM)


def tamper_signature(csr_pem: bytes) -> bytes:
    """The same CSR with one bit of its signature flipped."""
    csr = x509.load_pem_x509_csr(csr_pem)
    der = bytearray(csr.public_bytes(Encoding.DER))
    der[-3] ^= 0x01  # inside the signature BIT STRING at the end
    body = base64.encodebytes(bytes(der)).replace(b"\n", b"")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return (
        b"-----BEGIN CERTIFICATE REQUEST-----\n"
        + b"\n".join(lines)
        + b"\n-----END CERTIFICATE REQUEST-----\n"
    )
