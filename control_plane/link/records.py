"""A node's records as a transport decoded them, and the pure rules a batch must meet.

Pure (no database, no transport): `wire` builds `IncomingRecord`s from protobuf and
`ingest.RecordIngest` validates and stores them; storing is not done here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, NamedTuple, NoReturn

from control_plane.errors import InvalidInputError, PayloadTooLargeError

__all__ = [
    "RECORD_KINDS",
    "IncomingRecord",
    "IngestLimits",
    "validate_batch",
]

RECORD_KINDS = frozenset({"event", "health"})
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_CONTENT_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]{1,32}/[A-Za-z0-9!#$&^_.+-]{1,31}\Z")
# What agents send (checked against _CONTENT_TYPE by a test); others go through the regex.
_COMMON_CONTENT_TYPES: Final = frozenset(
    {"application/json", "application/x-protobuf", "application/octet-stream"}
)

_MAX_SEQ: Final = 2**63 - 1  # node_records.seq is a signed 64-bit integer


class IncomingRecord(NamedTuple):
    """A record as a transport decoded it, not yet validated (`validate_batch`).

    A named tuple: one is made per record on the ingestion path, and a frozen
    dataclass cost three times as much to build. `wire.incoming_records` builds it with
    `tuple.__new__`, which checks no field count: a field added here goes there too."""

    id: str
    seq: int
    kind: str
    created_at: datetime
    content_type: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class IngestLimits:
    max_records: int = 1000
    max_payload_bytes: int = 256 * 1024
    # At most this many rows per group commit (a batch is never split across groups).
    max_group_rows: int = 5000
    # Batches waiting for the writer; `submit` refuses more (UnavailableError).
    max_queued_batches: int = 20_000
    # Writer threads of `submit`, each committing its own group on its own connection:
    # one writes while another waits for its commit.
    writers: int = 2


def validate_batch(records: Sequence[IncomingRecord], limits: IngestLimits) -> None:
    """Refuse a malformed batch whole, naming the first bad record (pure)."""
    if len(records) > limits.max_records:
        raise PayloadTooLargeError(
            f"a batch carries at most {limits.max_records} records, got {len(records)}",
            limit=limits.max_records,
        )
    # One pass of cheap checks per record (this runs for every record ingested); the
    # message naming the bad record is built only when one fails.
    uuid_match = _UUID.match
    max_payload = limits.max_payload_bytes
    for index, (record_id, seq, kind, created_at, content_type, payload) in enumerate(records):
        if (
            uuid_match(record_id) is not None
            and kind in RECORD_KINDS
            and 1 <= seq <= _MAX_SEQ
            and created_at.tzinfo is not None
            and (content_type in _COMMON_CONTENT_TYPES or _CONTENT_TYPE.match(content_type))
            and len(payload) <= max_payload
        ):
            continue
        _refuse_record(index, records[index], limits)


def _refuse_record(index: int, record: IncomingRecord, limits: IngestLimits) -> NoReturn:
    """Raise the error naming why `record` (which failed a check) is refused."""
    where = f"record {index} ({record.id!r})"
    if not _UUID.match(record.id):
        raise InvalidInputError(f"{where}: id is not a lowercase UUID", index=index)
    if record.kind not in RECORD_KINDS:
        raise InvalidInputError(f"{where}: unknown kind {record.kind!r}", index=index)
    if not 1 <= record.seq <= _MAX_SEQ:
        raise InvalidInputError(f"{where}: seq must be in [1, 2**63 - 1]", index=index)
    if record.created_at.tzinfo is None:
        raise InvalidInputError(f"{where}: created_at has no time zone", index=index)
    if not _CONTENT_TYPE.match(record.content_type):
        raise InvalidInputError(f"{where}: bad content type", index=index)
    if len(record.payload) > limits.max_payload_bytes:
        raise PayloadTooLargeError(
            f"{where}: payload of {len(record.payload)} bytes is over {limits.max_payload_bytes}",
            index=index,
            limit=limits.max_payload_bytes,
        )
    # Only if validate_batch's one-pass check and these rules ever disagree.
    raise InvalidInputError(f"{where}: refused", index=index)
