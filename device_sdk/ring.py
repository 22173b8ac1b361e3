"""The file ring: `SendBuffer`'s journal on the camera's flash, so a reboot loses nothing.

One append-only file of checksummed records (PUT a message, DEL an id), rewritten with
only the live messages when it grows past twice the buffer's bound, and on every open.
Its size is bounded by the buffer (ADR 0037). Not a database: one writer, one directory.

Record: magic ``b"EF"``, kind (``P`` or ``D``), body length (u32, big-endian), CRC-32 of
kind + body, body. A torn write at the tail (power lost mid-append) or a damaged stretch
fails its checksum; reading resynchronises at the next record whose checksum holds, and
counts each damaged stretch once.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

from device_sdk.buffer import _PUT_FIXED, Message, Priority, Recovered

__all__ = ["FileRing", "read_records"]

_MAGIC = b"EF"
_HEADER = struct.Struct(">2scII")  # magic, kind, body length, crc32(kind + body)
_PUT, _DEL = b"P", b"D"
_FILE = "ring.log"


def _record(kind: bytes, body: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, kind, len(body), zlib.crc32(kind + body)) + body


def _put_body(message: Message) -> bytes:
    message_id, topic = message.message_id.encode(), message.topic.encode()
    fixed = _PUT_FIXED.pack(int(message.priority), message.expires_at, len(message_id), len(topic))
    return fixed + message_id + topic + message.payload


def _parse_put(body: bytes) -> Message:
    priority, expires_at, id_len, topic_len = _PUT_FIXED.unpack_from(body)
    at = _PUT_FIXED.size
    message_id = body[at : at + id_len].decode()
    topic = body[at + id_len : at + id_len + topic_len].decode()
    return Message(
        message_id, topic, Priority(priority), body[at + id_len + topic_len :], expires_at
    )


def _read_record(data: bytes, at: int) -> tuple[bytes, bytes, int] | None:
    """(kind, body, next offset) of a sound record at `at`, else None."""
    if at + _HEADER.size > len(data):
        return None
    magic, kind, length, crc = _HEADER.unpack_from(data, at)
    end = at + _HEADER.size + length
    if magic != _MAGIC or kind not in (_PUT, _DEL) or end > len(data):
        return None
    body = data[at + _HEADER.size : end]
    if zlib.crc32(kind + body) != crc:
        return None
    return kind, body, end


def read_records(data: bytes) -> Recovered:
    """The live messages in `data`, in write order, and the damaged stretches skipped."""
    live: dict[str, Message] = {}
    corrupt, at, damaged = 0, 0, False
    while at < len(data):
        found = _read_record(data, at)
        if found is None:
            corrupt += not damaged
            damaged = True
            at = data.find(_MAGIC, at + 1)
            if at < 0:
                break
            continue
        damaged = False
        kind, body, at = found
        if kind == _DEL:
            live.pop(body.decode(errors="replace"), None)
            continue
        try:
            message = _parse_put(body)
        except (struct.error, UnicodeDecodeError, ValueError):
            corrupt += 1  # checksum held but the body is not ours: a bug, never a crash
            continue
        live.pop(message.message_id, None)
        live[message.message_id] = message
    return Recovered(list(live.values()), corrupt)


class FileRing:
    """`Journal` over one file in `directory`, for a buffer of `capacity_bytes`.

    `sync=True` fsyncs every PUT before the SDK reports the message buffered; removals
    are flushed, not fsynced (a lost removal means one resend with the same id). The file
    is rewritten when it passes twice the capacity, so it never holds much more.
    """

    def __init__(self, directory: Path, capacity_bytes: int, *, sync: bool = True) -> None:
        self.directory = Path(directory)
        self.path = self.directory / _FILE
        self.compact_at = 2 * capacity_bytes
        self.sync = sync
        self._live: dict[str, Message] = {}
        self._file: BinaryIO | None = None
        self._size = 0

    def recover(self) -> Recovered:
        self.directory.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        recovered = read_records(data)
        self._live = {m.message_id: m for m in recovered.messages}
        self._rewrite()  # a clean file: no torn tail to append after, no dead records
        return recovered

    def append(self, message: Message) -> None:
        self._live[message.message_id] = message
        self._write(_record(_PUT, _put_body(message)), sync=self.sync)

    def remove(self, message_id: str) -> None:
        if self._live.pop(message_id, None) is None:
            return
        self._write(_record(_DEL, message_id.encode()), sync=False)

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def file_size(self) -> int:
        return self._size

    def _write(self, record: bytes, *, sync: bool) -> None:
        if self._file is None:
            raise RuntimeError("FileRing used before recover() or after close()")
        self._file.write(record)
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())
        self._size += len(record)
        if self._size > self.compact_at:
            self._rewrite()

    def _rewrite(self) -> None:
        """Temp file, fsync, os.replace, fsync the directory: the old file or the new one."""
        if self._file is not None:
            self._file.close()
        temp = self.path.with_name(_FILE + ".tmp")
        data = b"".join(_record(_PUT, _put_body(m)) for m in self._live.values())
        with temp.open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        temp.replace(self.path)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._file = self.path.open("ab")
        self._size = len(data)
