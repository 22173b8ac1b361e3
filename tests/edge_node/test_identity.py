"""The node's key and certificate on disk through a renewal: when it is due, and what every
crash point leaves behind (always a key with its own certificate).

Against the real control plane (renewal over mTLS, refusal of a revoked node, a crash
between the two renames followed by a new Sync) see tests/control_plane/link/test_renewal.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from edge_node.enroll import (
    EnrollmentFiles,
    generate_node_key,
    key_matches_certificate,
    private_key_pem,
)
from edge_node.errors import InvalidInputError
from edge_node.fsutil import atomic_write
from edge_node.identity import (
    Recovery,
    RenewalConfig,
    recover_pending_renewal,
    renewal_due_at,
)

START = datetime(2026, 11, 1, tzinfo=UTC)


def certificate(
    key: ec.EllipticCurvePrivateKey,
    not_before: datetime = START,
    lifetime: timedelta = timedelta(days=6),
) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "n-test")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + lifetime)
        .sign(key, hashes.SHA256())
        .public_bytes(Encoding.PEM)
    )


class Pair:
    def __init__(self) -> None:
        key = generate_node_key()
        self.key = private_key_pem(key)
        self.cert = certificate(key)


@pytest.fixture
def files(tmp_path: Path) -> EnrollmentFiles:
    enrolled = EnrollmentFiles(directory=tmp_path, node_id="n-test", fleet="gates")
    (tmp_path / "ca.crt").write_bytes(b"ca")
    return enrolled


def install(files: EnrollmentFiles, pair: Pair) -> None:
    atomic_write(files.key_path, pair.key, mode=0o600)
    atomic_write(files.cert_path, pair.cert)


def on_disk(files: EnrollmentFiles) -> tuple[bytes, bytes]:
    return files.key_path.read_bytes(), files.cert_path.read_bytes()


def test_renewal_is_due_at_two_thirds_of_the_lifetime() -> None:
    cert = certificate(generate_node_key(), lifetime=timedelta(days=6))
    assert renewal_due_at(cert) == START + timedelta(days=4)
    assert renewal_due_at(cert, 0.5) == START + timedelta(days=3)
    for fraction in (0.0, 1.0, 1.5):
        with pytest.raises(InvalidInputError):
            RenewalConfig(renew_at_fraction=fraction)


def test_keys_and_certificates_are_matched_by_public_key() -> None:
    one, two = Pair(), Pair()
    assert key_matches_certificate(one.key, one.cert)
    assert not key_matches_certificate(one.key, two.cert)
    assert not key_matches_certificate(one.key, b"not a certificate")
    assert not key_matches_certificate(b"", one.cert)


def test_nothing_pending_is_nothing_to_do(files: EnrollmentFiles) -> None:
    old = Pair()
    install(files, old)
    assert recover_pending_renewal(files) is Recovery.NOTHING
    assert on_disk(files) == (old.key, old.cert)


def test_a_crash_before_the_certificate_came_keeps_the_old_pair(files: EnrollmentFiles) -> None:
    old, new = Pair(), Pair()
    install(files, old)
    atomic_write(files.pending_key_path, new.key, mode=0o600)  # step 1 only

    assert files.credentials().key_pem == old.key
    assert recover_pending_renewal(files) is Recovery.DISCARDED
    assert on_disk(files) == (old.key, old.cert)
    assert not files.pending_key_path.exists()


def test_a_crash_with_both_staged_rolls_forward(files: EnrollmentFiles) -> None:
    old, new = Pair(), Pair()
    install(files, old)
    atomic_write(files.pending_key_path, new.key, mode=0o600)
    atomic_write(files.pending_cert_path, new.cert)  # steps 1 and 2

    credentials = files.credentials()
    assert (credentials.key_pem, credentials.certificate_pem) == (old.key, old.cert)
    assert recover_pending_renewal(files) is Recovery.COMPLETED
    assert on_disk(files) == (new.key, new.cert)
    assert files.key_path.stat().st_mode & 0o777 == 0o600
    assert not files.pending_key_path.exists() and not files.pending_cert_path.exists()


def test_a_crash_between_the_renames_is_read_as_the_new_pair_and_finished(
    files: EnrollmentFiles,
) -> None:
    old, new = Pair(), Pair()
    install(files, old)
    atomic_write(files.key_path, new.key, mode=0o600)  # step 3 done, step 4 not
    atomic_write(files.pending_cert_path, new.cert)

    credentials = files.credentials()
    assert (credentials.key_pem, credentials.certificate_pem) == (new.key, new.cert)
    assert recover_pending_renewal(files) is Recovery.COMPLETED
    assert on_disk(files) == (new.key, new.cert)
    assert not files.pending_cert_path.exists()


def test_staged_files_that_do_not_belong_together_are_dropped(files: EnrollmentFiles) -> None:
    old, one, two = Pair(), Pair(), Pair()
    install(files, old)
    atomic_write(files.pending_key_path, one.key, mode=0o600)
    atomic_write(files.pending_cert_path, two.cert)
    assert recover_pending_renewal(files) is Recovery.DISCARDED
    assert on_disk(files) == (old.key, old.cert)

    atomic_write(files.pending_cert_path, two.cert)  # a stray certificate alone
    assert recover_pending_renewal(files) is Recovery.DISCARDED
    assert on_disk(files) == (old.key, old.cert)
    assert not files.pending_key_path.exists() and not files.pending_cert_path.exists()
