"""A node's records as a transport decoded them, and the pure rules a batch must meet.

Pure (no database, no transport): `wire` builds `IncomingRecord`s from protobuf and
`ingest.RecordIngest` validates and stores them; storing is not done here.

Records of kind ``results`` (sampled inference results, ``edgefleet.agent.results/1``)
are read here too (`split_results`): they go to their own bounded table, not to
``node_records``. A results document that cannot be read is not a reason to refuse the
batch: it is a best-effort sample, so it is left out, named (`UnreadableResult`) and
acked with the rest, and the node does not send it again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any, Final, NamedTuple, NoReturn

from control_plane.errors import InvalidInputError, PayloadTooLargeError
from protos.bundle.results import ResultWireError, result_from_wire

__all__ = [
    "RECORD_KINDS",
    "RESULTS_KIND",
    "IncomingRecord",
    "IngestLimits",
    "ResultRow",
    "UnreadableResult",
    "read_result",
    "split_results",
    "validate_batch",
]

RESULTS_KIND: Final = "results"
RECORD_KINDS = frozenset({"event", "health", RESULTS_KIND})
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
    # Sampled inference results kept per node (the newest by the node's sequence).
    results_per_node: int = 100

    def __post_init__(self) -> None:
        if not 1 <= self.results_per_node <= 10_000:
            raise InvalidInputError(
                f"results_per_node must be in [1, 10000], got {self.results_per_node}",
                field="results_per_node",
            )


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


class ResultRow(NamedTuple):
    """A readable ``results`` record: what ``node_results`` stores of it."""

    record_id: str
    seq: int
    created_at: datetime
    stream: str
    model: str
    version: str | None
    kind: str
    captured_at: datetime
    document: dict[str, Any]


@dataclass(frozen=True, slots=True)
class UnreadableResult:
    """A ``results`` record left out of a batch, and why (the message names the field)."""

    index: int
    record_id: str
    message: str


_KIND_OF = itemgetter(2)


def split_results(
    records: Sequence[IncomingRecord],
) -> tuple[Sequence[IncomingRecord], list[ResultRow], list[UnreadableResult]]:
    """The batch's records for ``node_records``, its readable results, its unreadable ones.

    Call on a batch that passed `validate_batch`. A batch without results (nearly every
    one) is returned as it is, after one pass over the kinds in C.
    """
    if RESULTS_KIND not in set(map(_KIND_OF, records)):
        return records, [], []
    others: list[IncomingRecord] = []
    results: list[ResultRow] = []
    unreadable: list[UnreadableResult] = []
    for index, record in enumerate(records):
        if record.kind != RESULTS_KIND:
            others.append(record)
            continue
        try:
            results.append(read_result(record))
        except ResultWireError as exc:
            unreadable.append(UnreadableResult(index, record.id, str(exc)))
    return others, results, unreadable


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def read_result(record: IncomingRecord) -> ResultRow:
    """One ``results`` record read as ``edgefleet.agent.results/1``; ResultWireError names
    what is wrong with it."""
    if record.content_type != "application/json":
        raise ResultWireError(
            f"results: content type {record.content_type!r}, expected application/json"
        )
    try:
        doc = json.loads(record.payload, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ResultWireError(f"results: the payload is not JSON ({exc})") from None
    if not isinstance(doc, Mapping):
        raise ResultWireError("results: the payload is not a JSON object")
    clean = result_from_wire(doc)
    # Neither database column takes a NUL character (PostgreSQL refuses it in text and
    # JSONB): a document holding one could never be stored, so it is not read.
    if "\\u0000" in json.dumps(clean):
        raise ResultWireError("results: a string holds a NUL character")
    try:
        captured_at = datetime.fromisoformat(clean["captured_at"])
    except ValueError:
        captured_at = None
    if captured_at is None or captured_at.tzinfo is None:
        raise ResultWireError("results.captured_at: expected an ISO 8601 time with a UTC offset")
    return ResultRow(
        record_id=record.id,
        seq=record.seq,
        created_at=record.created_at,
        stream=clean["stream"],
        model=clean["model"],
        version=clean["version"],
        kind=clean["kind"],
        captured_at=captured_at,
        document=clean,
    )
