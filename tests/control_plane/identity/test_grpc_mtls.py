"""The CA's certificates work for real mTLS in gRPC (BoringSSL), the transport nodes use.

Guards the choice of ECDSA P-256 and the certificate profile: a TLS stack that
rejected them would break every node at its first connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from control_plane.identity.ca import CertificateAuthority
from tests.control_plane.identity.helpers import make_csr, new_key

METHOD = "/edgefleet.test.Identity/WhoAmI"


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "ca", now=datetime.now(UTC))


@pytest.fixture
def port(ca: CertificateAuthority) -> Iterator[int]:
    def who_am_i(request: bytes, context: grpc.ServicerContext) -> bytes:
        # What the future interceptor does: the peer certificate from the TLS session.
        pem = context.auth_context()["x509_pem_cert"][0]
        identity = ca.node_identity_from_certificate(pem, now=datetime.now(UTC))
        return f"{identity.fleet}/{identity.node_id}".encode()

    handler = grpc.method_handlers_generic_handler(
        "edgefleet.test.Identity",
        {"WhoAmI": grpc.unary_unary_rpc_method_handler(who_am_i)},
    )
    server_creds = ca.issue_server_certificate(["localhost"], ["127.0.0.1"], now=datetime.now(UTC))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_secure_port(
        "127.0.0.1:0",
        grpc.ssl_server_credentials(
            [(server_creds.private_key_pem, server_creds.certificate_pem)],
            root_certificates=ca.ca_pem,
            require_client_auth=True,
        ),
    )
    server.start()
    try:
        yield bound
    finally:
        server.stop(grace=None)


def call(port: int, ca_pem: bytes, key_pem: bytes, cert_pem: bytes) -> bytes:
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
    )
    with grpc.secure_channel(
        f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", "localhost")]
    ) as channel:
        stub = channel.unary_unary(METHOD)
        return bytes(stub(b"", timeout=10))


def node_credentials(ca: CertificateAuthority) -> tuple[bytes, bytes]:
    key = new_key()
    issued = ca.issue_node_certificate(
        make_csr(key), node_id="n-0123456789ab", fleet="gates", now=datetime.now(UTC)
    )
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()), issued.pem


def test_a_node_certificate_passes_grpc_mtls_and_names_the_node(
    ca: CertificateAuthority, port: int
) -> None:
    key_pem, cert_pem = node_credentials(ca)
    assert call(port, ca.ca_pem, key_pem, cert_pem) == b"gates/n-0123456789ab"


def test_a_certificate_from_another_ca_fails_the_handshake(
    ca: CertificateAuthority, port: int, tmp_path: Path
) -> None:
    other = CertificateAuthority.load_or_create(tmp_path / "other", now=datetime.now(UTC))
    key_pem, cert_pem = node_credentials(other)
    with pytest.raises(grpc.RpcError) as info:
        call(port, ca.ca_pem, key_pem, cert_pem)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
