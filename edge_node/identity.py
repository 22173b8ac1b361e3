"""Certificate renewal: a fresh key and certificate before the current one expires, asked
for over the node's own mTLS link, and swapped in on disk so a crash never leaves a key
without its certificate.

When the certificate has used `renew_at_fraction` (2/3) of its lifetime, `renew_if_due`
makes a new P-256 key (rotated at every renewal: a key that leaked stops working within
one certificate lifetime), sends a CSR with `RenewCertificate`, and writes the result in
four durable steps:

    1. node.key.next   the new key (0600), before the call
    2. node.crt.next   the new certificate, once the control plane answered
    3. node.key.next -> node.key      (rename)
    4. node.crt.next -> node.crt      (rename), then fsync the directory

Each write is atomic (`atomic_write`, `os.replace`), so after a crash the directory is
in one of these states, and each still holds a usable pair:

    crash before 2      node.key/node.crt old (valid until they expire), a stray .next key
    between 2 and 3     old pair plus a complete staged pair
    between 3 and 4     node.key new, node.crt old, node.crt.next new

`recover_pending_renewal` (run at start and before every renewal) rolls the second and
third forward and drops the first's stray key; `EnrollmentFiles.credentials()` answers
the matching pair even before that. The control plane keeps the certificate a renewal
was authenticated with as valid as it was (`Enrollments.renew`), so a renewal whose
answer was lost to a crash can simply be done again.

Not here: when to reconnect (the link ends its stream once the files are swapped; the
uplink reconnects) and enrollment (`edge_node.enroll`).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread
from cryptography import x509

from edge_node.clock import Clock
from edge_node.enroll import (
    EnrollmentFiles,
    generate_node_key,
    key_matches_certificate,
    make_csr,
    private_key_pem,
)
from edge_node.errors import InvalidInputError, StorageError
from edge_node.fsutil import atomic_write, fsync_dir
from edge_node.link.base import Backoff, LinkError, LinkRefusedError, LinkRequestError
from edge_node.link.grpc_link import GrpcNodeLink

__all__ = [
    "DEFAULT_RENEW_AT_FRACTION",
    "CertificateMismatchError",
    "Recovery",
    "RenewalConfig",
    "RenewalRefusedError",
    "RenewedCertificate",
    "certificate_validity",
    "recover_pending_renewal",
    "renew_if_due",
    "renewal_due_at",
    "run_renewal",
]

log = logging.getLogger(__name__)

DEFAULT_RENEW_AT_FRACTION: Final = 2 / 3
_KEY_MODE: Final = 0o600
_PUBLIC_MODE: Final = 0o644


class RenewalRefusedError(LinkRefusedError):
    """The control plane refused to renew this node's certificate (revoked, unknown, or
    its certificate is no longer accepted): retrying cannot help; re-enroll the node."""

    title = "certificate renewal refused"


class CertificateMismatchError(LinkRequestError):
    """The control plane answered a certificate that is not for the key this node sent;
    nothing was written."""

    title = "renewed certificate does not match the key"


class Recovery(StrEnum):
    """What `recover_pending_renewal` found and did."""

    NOTHING = "nothing"
    COMPLETED = "completed"  # a staged pair was swapped in
    DISCARDED = "discarded"  # a stray staged file was removed; the current pair stays


@dataclass(frozen=True, slots=True)
class RenewalConfig:
    renew_at_fraction: float = DEFAULT_RENEW_AT_FRACTION
    # The longest the loop sleeps between two looks at the certificate, so a clock that
    # jumps (suspend, NTP) is noticed within this.
    check_interval_s: float = 3600.0
    # Retries after an outage; a refusal ends the loop instead.
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=30.0, cap_s=3600.0))

    def __post_init__(self) -> None:
        _check_fraction(self.renew_at_fraction)
        if self.check_interval_s <= 0:
            raise InvalidInputError("check_interval_s must be positive")


@dataclass(frozen=True, slots=True)
class RenewedCertificate:
    serial: int
    not_before: datetime
    not_after: datetime


# ------------------------------------------------------------------- pure rules


def _check_fraction(fraction: float) -> None:
    if not 0.0 < fraction < 1.0:
        raise InvalidInputError(f"renew_at_fraction must be between 0 and 1, got {fraction}")


def certificate_validity(certificate_pem: bytes) -> tuple[datetime, datetime]:
    """(not_before, not_after) of a PEM certificate, timezone-aware UTC."""
    try:
        cert = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError as exc:
        raise StorageError("the node certificate is not a PEM certificate") from exc
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def renewal_due_at(
    certificate_pem: bytes, renew_at_fraction: float = DEFAULT_RENEW_AT_FRACTION
) -> datetime:
    """When the certificate has used `renew_at_fraction` of its lifetime."""
    not_before, not_after = certificate_validity(certificate_pem)
    return not_before + (not_after - not_before) * renew_at_fraction


# ------------------------------------------------------------------ on disk


def recover_pending_renewal(files: EnrollmentFiles) -> Recovery:
    """Finish or undo a renewal a crash interrupted (see the module docstring)."""
    staged_key = _read_or_none(files.pending_key_path)
    staged_cert = _read_or_none(files.pending_cert_path)
    if staged_cert is None:
        if staged_key is None:
            return Recovery.NOTHING
        # No certificate came for this key (or it was lost with a crash): the current
        # pair stays, and the next renewal starts afresh.
        _remove(files.pending_key_path)
        log.info("dropped the key of an unfinished certificate renewal")
        return Recovery.DISCARDED
    if staged_key is not None:
        if key_matches_certificate(staged_key, staged_cert):
            _swap_in(files)
            log.info("finished a certificate renewal interrupted before its swap")
            return Recovery.COMPLETED
    elif key_matches_certificate(files.key_path.read_bytes(), staged_cert):
        files.pending_cert_path.replace(files.cert_path)
        fsync_dir(files.directory)
        log.info("finished a certificate renewal interrupted in its swap")
        return Recovery.COMPLETED
    # Staged files that do not belong together: not ours to guess; keep the current pair.
    _remove(files.pending_key_path)
    _remove(files.pending_cert_path)
    log.warning("dropped staged renewal files that do not form a key pair")
    return Recovery.DISCARDED


def _stage_key(files: EnrollmentFiles, key_pem: bytes) -> None:
    atomic_write(files.pending_key_path, key_pem, mode=_KEY_MODE)


def _stage_and_swap(files: EnrollmentFiles, certificate_pem: bytes) -> None:
    atomic_write(files.pending_cert_path, certificate_pem, mode=_PUBLIC_MODE)
    _swap_in(files)


def _swap_in(files: EnrollmentFiles) -> None:
    # Key first: in between, credentials() pairs the new key with the staged certificate.
    files.pending_key_path.replace(files.key_path)
    files.pending_cert_path.replace(files.cert_path)
    fsync_dir(files.directory)


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


# ------------------------------------------------------------------ renewal


async def renew_if_due(
    link: GrpcNodeLink,
    files: EnrollmentFiles,
    now: datetime,
    *,
    renew_at_fraction: float = DEFAULT_RENEW_AT_FRACTION,
) -> RenewedCertificate | None:
    """Renew the node's certificate if it is due at `now`; None when it is not yet.

    On success the new key and certificate are in `node.key` / `node.crt` and the link
    has been told (it reconnects with them). Raises `RenewalRefusedError` when the
    control plane refuses the node (revoked: re-enroll it), `LinkUnavailableError` when
    it cannot be reached (retry later), `CertificateMismatchError` /
    `LinkRequestError` for an answer or request that went wrong; in every failure the
    current pair stays as it was.
    """
    _check_fraction(renew_at_fraction)
    await anyio.to_thread.run_sync(recover_pending_renewal, files)
    current = await anyio.to_thread.run_sync(files.cert_path.read_bytes)
    due_at = renewal_due_at(current, renew_at_fraction)
    if now < due_at:
        return None
    _, not_after = certificate_validity(current)
    if now >= not_after:
        log.warning(
            "the node certificate expired at %s by this node's clock; trying to renew "
            "anyway (re-enroll the node if the control plane refuses)",
            not_after.isoformat(),
        )
    key = generate_node_key()
    key_pem = private_key_pem(key)
    await anyio.to_thread.run_sync(_stage_key, files, key_pem)
    try:
        response = await link.renew_certificate(make_csr(key))
        certificate_pem = bytes(response.certificate_pem)
        if not key_matches_certificate(key_pem, certificate_pem):
            raise CertificateMismatchError(
                "the control plane answered a certificate for another key; kept the current one"
            )
    except LinkRefusedError as exc:
        _remove(files.pending_key_path)
        reason = exc.fields.get("reason") or exc.fields.get("code")
        raise RenewalRefusedError(
            f"the control plane refused to renew the certificate of node {files.node_id} "
            f"({reason}): {exc.message}; the node must be enrolled again",
            reason=reason,
            node_id=files.node_id,
        ) from exc
    except BaseException:
        _remove(files.pending_key_path)
        raise
    # Shielded: once the answer is here, stage and swap even if we are being cancelled,
    # so the control plane's new current certificate is not thrown away.
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(_stage_and_swap, files, certificate_pem)
    link.credentials_renewed()
    cert = x509.load_pem_x509_certificate(certificate_pem)
    renewed = RenewedCertificate(
        serial=cert.serial_number,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
    )
    log.info(
        "node certificate renewed; valid until %s",
        renewed.not_after.isoformat(),
        extra={"node_id": files.node_id},
    )
    return renewed


async def run_renewal(
    link: GrpcNodeLink,
    files: EnrollmentFiles,
    stop: anyio.Event,
    *,
    clock: Clock,
    config: RenewalConfig | None = None,
) -> None:
    """Renew whenever due, until `stop` is set.

    Sleeps until the certificate is due, at most `check_interval_s` at a time (times come
    from `clock`). An outage or a failed request is retried with capped, jittered
    backoff; `RenewalRefusedError` ends the loop (it propagates), as does local storage
    that cannot be read.
    """
    config = config or RenewalConfig()
    attempt = 0
    while not stop.is_set():
        try:
            await renew_if_due(link, files, clock.now(), renew_at_fraction=config.renew_at_fraction)
            current = await anyio.to_thread.run_sync(files.cert_path.read_bytes)
            until_due = renewal_due_at(current, config.renew_at_fraction) - clock.now()
            if until_due > timedelta(0):
                attempt = 0
                wait_s = min(config.check_interval_s, until_due.total_seconds())
            else:
                # Due again right after renewing: this node's clock runs far ahead of the
                # control plane's. Back off rather than renew in a tight loop.
                wait_s = config.backoff.delay(attempt)
                attempt += 1
        except RenewalRefusedError:
            raise
        except LinkError as exc:
            wait_s = config.backoff.delay(attempt)
            attempt += 1
            log.warning("certificate renewal failed (%s); retrying in %.0fs", exc.message, wait_s)
        with anyio.move_on_after(wait_s):
            await stop.wait()
