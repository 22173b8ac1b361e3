"""The fleet wire messages round-trip and tolerate fields from newer writers."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from protos.edgefleet.fleet.v1 import director_pb2, registry_pb2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire_type) + payload


def _timestamp(iso: str) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(datetime.fromisoformat(iso))
    return ts


def _assignment() -> director_pb2.DirectorAssignment:
    return director_pb2.DirectorAssignment(
        fleet="acme",
        node_id="node-0001",
        sequence=2**40 + 7,
        target_path="models/people-detector/1.4.0/model.onnx",
        sha256="ab" * 32,
        length=123_456_789,
        issued_at=_timestamp("2026-01-02T03:04:05+00:00"),
        expires_at=_timestamp("2026-01-03T03:04:05+00:00"),
        format_version=1,
    )


def test_package_and_full_names() -> None:
    assert director_pb2.DESCRIPTOR.package == "edgefleet.fleet.v1"
    assert registry_pb2.DESCRIPTOR.package == "edgefleet.fleet.v1"
    assert (
        director_pb2.DirectorAssignment.DESCRIPTOR.full_name
        == "edgefleet.fleet.v1.DirectorAssignment"
    )


def test_director_assignment_round_trips() -> None:
    original = _assignment()
    parsed = director_pb2.DirectorAssignment.FromString(original.SerializeToString())
    assert parsed == original
    assert parsed.expires_at.ToDatetime(tzinfo=UTC) == datetime(2026, 1, 3, 3, 4, 5, tzinfo=UTC)


def test_signed_assignment_carries_the_exact_signed_bytes() -> None:
    payload = _assignment().SerializeToString()
    signed = director_pb2.SignedDirectorAssignment(
        assignment=payload, keyid="cd" * 32, signature=bytes(64)
    )
    parsed = director_pb2.SignedDirectorAssignment.FromString(signed.SerializeToString())
    assert parsed.assignment == payload
    assert parsed.keyid == "cd" * 32
    assert parsed.signature == bytes(64)
    assert director_pb2.DirectorAssignment.FromString(parsed.assignment) == _assignment()


def test_unknown_fields_from_a_newer_writer_are_tolerated_and_kept() -> None:
    newer = (
        _assignment().SerializeToString()
        + _field(12, 0, _varint(42))  # a future varint field
        + _field(13, 2, _varint(5) + b"hello")  # a future string / message field
        + _field(200, 1, bytes(8))  # a future fixed64 field
    )
    parsed = director_pb2.DirectorAssignment.FromString(newer)
    assert parsed.node_id == "node-0001"
    assert parsed.sequence == 2**40 + 7
    assert parsed.format_version == 1
    # Relaying (e.g. the control plane storing what it signed) must not drop them.
    assert parsed.SerializeToString() == newer

    signed = director_pb2.SignedDirectorAssignment(
        assignment=b"x", signature=b"s"
    ).SerializeToString()
    parsed_signed = director_pb2.SignedDirectorAssignment.FromString(
        signed + _field(4, 2, _varint(3) + b"new")
    )
    assert parsed_signed.assignment == b"x"


def test_older_writer_leaves_newer_fields_at_defaults() -> None:
    old = director_pb2.DirectorAssignment(node_id="n", sequence=1).SerializeToString()
    parsed = director_pb2.DirectorAssignment.FromString(old)
    assert parsed.format_version == 0  # a reader treats 0 as "unversioned" and refuses it
    assert not parsed.HasField("expires_at")


def test_model_version_summary_round_trips() -> None:
    summary = registry_pb2.ModelVersionSummary(
        fleet="acme",
        model="people-detector",
        version="1.4.0",
        release_counter=12,
        target_path="models/people-detector/1.4.0/model.onnx",
        sha256="ef" * 32,
        length=4096,
        targets_version=31,
        created_at=_timestamp("2026-02-03T04:05:06+00:00"),
    )
    data = summary.SerializeToString() + _field(99, 0, _varint(1))
    parsed = registry_pb2.ModelVersionSummary.FromString(data)
    assert parsed.release_counter == 12
    assert parsed.targets_version == 31
    parsed.DiscardUnknownFields()
    assert parsed == summary
