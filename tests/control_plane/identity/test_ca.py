"""The fleet CA: what it certifies, what it refuses, and how it survives restarts and races."""

from __future__ import annotations

import stat
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from control_plane.errors import InvalidInputError, PolicyError
from control_plane.identity.ca import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    CertificateAuthority,
    CertificateRejectedError,
    InvalidCsrError,
    node_urn,
    parse_node_urn,
)
from tests.control_plane.identity.helpers import make_csr, new_key, tamper_signature

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NODE = "n-0123456789ab"


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "ca", now=NOW)


def rejected_reason(ca: CertificateAuthority, cert: bytes, now: datetime = NOW) -> str:
    with pytest.raises(CertificateRejectedError) as info:
        ca.node_identity_from_certificate(cert, now=now)
    return str(info.value.fields["reason"])


# ------------------------------------------------------------------ issuing


def test_an_issued_certificate_chains_to_the_ca_and_names_the_node(
    ca: CertificateAuthority,
) -> None:
    key = new_key()
    issued = ca.issue_node_certificate(make_csr(key), node_id=NODE, fleet="gates", now=NOW)
    cert = x509.load_pem_x509_certificate(issued.pem)

    cert.verify_directly_issued_by(ca.certificate)
    # An independent RFC 5280 path validation, as a TLS peer would do it.
    verifier = (
        PolicyBuilder()
        .store(Store([x509.load_pem_x509_certificate(ca.ca_pem)]))
        .time(NOW)
        .build_client_verifier()
    )
    verified = verifier.verify(cert, [])
    assert verified.subjects == [x509.UniformResourceIdentifier(f"urn:edgefleet:node:gates:{NODE}")]

    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == NODE
    assert cert.public_key() == key.public_key()
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.not_valid_before_utc == NOW - timedelta(minutes=5)  # clock skew allowance
    assert cert.not_valid_after_utc == NOW + timedelta(days=7) == issued.not_after
    assert issued.serial == f"{cert.serial_number:040x}"
    assert len(issued.serial) == 40


def test_the_csr_subject_and_san_are_ignored(ca: CertificateAuthority) -> None:
    csr = make_csr(
        common_name="n-ffffffffffff",
        san_uris=("urn:edgefleet:node:other:n-ffffffffffff", "https://evil.example"),
    )
    issued = ca.issue_node_certificate(csr, node_id=NODE, fleet="gates", now=NOW)
    cert = x509.load_pem_x509_certificate(issued.pem)

    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(san) == [x509.UniformResourceIdentifier(f"urn:edgefleet:node:gates:{NODE}")]
    assert cert.subject.rfc4514_string() == f"CN={NODE}"
    identity = ca.node_identity_from_certificate(issued.pem, now=NOW)
    assert (identity.fleet, identity.node_id) == ("gates", NODE)


def test_the_ttl_is_honoured_and_capped_by_the_ca(ca: CertificateAuthority) -> None:
    short = ca.issue_node_certificate(
        make_csr(), node_id=NODE, fleet="gates", now=NOW, ttl=timedelta(hours=1)
    )
    assert short.not_after == NOW + timedelta(hours=1)
    long = ca.issue_node_certificate(
        make_csr(), node_id=NODE, fleet="gates", now=NOW, ttl=timedelta(days=20000)
    )
    assert long.not_after == ca.not_after


@pytest.mark.parametrize(
    "key",
    [
        ec.generate_private_key(ec.SECP384R1()),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    ],
    ids=["p384", "rsa2048"],
)
def test_other_common_keys_are_certified(
    ca: CertificateAuthority, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
) -> None:
    issued = ca.issue_node_certificate(make_csr(key), node_id=NODE, fleet="gates", now=NOW)
    assert ca.node_identity_from_certificate(issued.pem, now=NOW).node_id == NODE


@pytest.mark.parametrize(
    ("csr", "reason"),
    [
        (b"not a csr", "csr-malformed"),
        (
            b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            "csr-malformed",
        ),
        (b"x" * 20000, "csr-malformed"),
        (tamper_signature(make_csr()), "csr-bad-signature"),
        (make_csr(rsa.generate_private_key(public_exponent=65537, key_size=1024)), "csr-key-type"),
        (make_csr(ec.generate_private_key(ec.SECP256K1())), "csr-key-type"),
        (make_csr(ed25519.Ed25519PrivateKey.generate()), "csr-key-type"),
    ],
    ids=["garbage", "bad-base64-body", "oversized", "bad-signature", "rsa1024", "k1", "ed25519"],
)
def test_bad_csrs_are_refused(ca: CertificateAuthority, csr: bytes, reason: str) -> None:
    with pytest.raises(InvalidCsrError) as info:
        ca.issue_node_certificate(csr, node_id=NODE, fleet="gates", now=NOW)
    assert info.value.fields["reason"] == reason
    with pytest.raises(InvalidCsrError):
        ca.check_csr(csr)


def test_the_ca_refuses_to_name_an_impossible_identity(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidInputError, match="cannot name"):
        ca.issue_node_certificate(make_csr(), node_id="a:b", fleet="gates", now=NOW)


# ---------------------------------------------------------------- verifying


def test_der_certificates_are_understood(ca: CertificateAuthority) -> None:
    issued = ca.issue_node_certificate(make_csr(), node_id=NODE, fleet="gates", now=NOW)
    der = x509.load_pem_x509_certificate(issued.pem).public_bytes(Encoding.DER)
    identity = ca.node_identity_from_certificate(der, now=NOW)
    assert (identity.fleet, identity.node_id, identity.serial) == ("gates", NODE, issued.serial)
    assert identity.not_after == issued.not_after


def test_an_expired_or_not_yet_valid_certificate_is_refused(ca: CertificateAuthority) -> None:
    issued = ca.issue_node_certificate(
        make_csr(), node_id=NODE, fleet="gates", now=NOW, ttl=timedelta(days=1)
    )
    assert rejected_reason(ca, issued.pem, NOW + timedelta(days=1, seconds=1)) == "cert-expired"
    assert rejected_reason(ca, issued.pem, NOW - timedelta(minutes=6)) == "cert-expired"
    # Within the skew allowance and up to the last second it is fine.
    ca.node_identity_from_certificate(issued.pem, now=NOW - timedelta(minutes=4))
    ca.node_identity_from_certificate(issued.pem, now=NOW + timedelta(days=1))


def test_a_certificate_from_another_ca_is_refused(ca: CertificateAuthority, tmp_path: Path) -> None:
    other = CertificateAuthority.load_or_create(tmp_path / "other", now=NOW)
    foreign = other.issue_node_certificate(make_csr(), node_id=NODE, fleet="gates", now=NOW)
    assert rejected_reason(ca, foreign.pem) == "cert-unknown-issuer"


def test_a_server_certificate_is_not_a_node_identity(ca: CertificateAuthority) -> None:
    server = ca.issue_server_certificate(["cp.example.com"], ["127.0.0.1"], now=NOW)
    assert rejected_reason(ca, server.certificate_pem) == "cert-invalid"


def test_a_ca_signed_client_certificate_without_a_node_urn_is_refused(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    ca_key = load_pem_private_key((tmp_path / "ca" / CA_KEY_FILE).read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    subject = new_key().public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE)]))
        .issuer_name(ca.certificate.subject)
        .public_key(subject)
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - timedelta(hours=1))
        .not_valid_after(NOW + timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier("urn:other:thing")]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    assert rejected_reason(ca, cert.public_bytes(Encoding.PEM)) == "cert-no-identity"


@pytest.mark.parametrize(
    "data", [b"", b"garbage", b"-----BEGIN CERTIFICATE-----\nxx\n", b"0" * 70000]
)
def test_garbage_is_refused_not_crashed_on(ca: CertificateAuthority, data: bytes) -> None:
    assert rejected_reason(ca, data) == "cert-malformed"


def test_node_urns_round_trip() -> None:
    assert parse_node_urn(node_urn("gates", NODE)) == ("gates", NODE)
    assert parse_node_urn("urn:edgefleet:node:gates") is None
    assert parse_node_urn(f"urn:edgefleet:node:Gates:{NODE}") is None


# ----------------------------------------------------------- server certs


def test_server_certificates_carry_names_and_a_fresh_key(ca: CertificateAuthority) -> None:
    creds = ca.issue_server_certificate(
        ["cp.example.com", "localhost"], ["127.0.0.1", "::1"], now=NOW
    )
    cert = x509.load_pem_x509_certificate(creds.certificate_pem)
    key = load_pem_private_key(creds.private_key_pem, None)
    assert cert.public_key() == key.public_key()
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["cp.example.com", "localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert "private_key_pem" not in repr(creds)
    verifier = (
        PolicyBuilder()
        .store(Store([ca.certificate]))
        .time(NOW)
        .build_server_verifier(x509.DNSName("cp.example.com"))
    )
    verifier.verify(cert, [])


@pytest.mark.parametrize(("hostnames", "ips"), [([], []), (["bad host"], []), ([], ["300.1.1.1"])])
def test_bad_server_names_are_refused(
    ca: CertificateAuthority, hostnames: list[str], ips: list[str]
) -> None:
    with pytest.raises(InvalidInputError):
        ca.issue_server_certificate(hostnames, ips, now=NOW)


# --------------------------------------------------------------- key files


def test_the_ca_is_created_once_with_a_private_key_file(tmp_path: Path) -> None:
    first = CertificateAuthority.load_or_create(tmp_path / "ca", now=NOW)
    key_file = tmp_path / "ca" / CA_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    again = CertificateAuthority.load_or_create(tmp_path / "ca", now=NOW + timedelta(days=30))
    assert again.ca_pem == first.ca_pem
    cert = first.certificate
    assert cert.not_valid_after_utc == NOW + timedelta(days=3650)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]


def test_concurrent_first_starts_agree_on_one_ca(tmp_path: Path) -> None:
    results: list[bytes] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def start() -> None:
        barrier.wait()
        try:
            results.append(CertificateAuthority.load_or_create(tmp_path / "ca", now=NOW).ca_pem)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert len(set(results)) == 1
    assert sorted(p.name for p in (tmp_path / "ca").iterdir()) == [CA_CERT_FILE, CA_KEY_FILE]


def test_a_lost_certificate_is_made_again_from_the_surviving_key(tmp_path: Path) -> None:
    first = CertificateAuthority.load_or_create(tmp_path / "ca", now=NOW)
    issued = first.issue_node_certificate(make_csr(), node_id=NODE, fleet="gates", now=NOW)
    (tmp_path / "ca" / CA_CERT_FILE).unlink()

    healed = CertificateAuthority.load_or_create(tmp_path / "ca", now=NOW)

    # Same key and subject: certificates issued before still verify.
    assert healed.ca_pem != first.ca_pem
    assert healed.node_identity_from_certificate(issued.pem, now=NOW).node_id == NODE


def test_a_certificate_for_another_key_is_refused_at_start(tmp_path: Path) -> None:
    CertificateAuthority.load_or_create(tmp_path / "a", now=NOW)
    CertificateAuthority.load_or_create(tmp_path / "b", now=NOW)
    (tmp_path / "a" / CA_CERT_FILE).write_bytes((tmp_path / "b" / CA_CERT_FILE).read_bytes())
    with pytest.raises(PolicyError, match="does not belong"):
        CertificateAuthority.load_or_create(tmp_path / "a", now=NOW)


def test_a_world_readable_ca_key_is_refused(tmp_path: Path) -> None:
    CertificateAuthority.load_or_create(tmp_path / "ca", now=NOW)
    (tmp_path / "ca" / CA_KEY_FILE).chmod(0o644)
    with pytest.raises(PolicyError, match="chmod 600"):
        CertificateAuthority.load_or_create(tmp_path / "ca", now=NOW)
