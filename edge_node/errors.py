"""The edge node's exception tree, split first by whose fault it is.

    EdgeNodeError                   root of everything the agent raises on purpose
    ├── InvalidInputError           the caller passed something malformed
    │   └── PayloadTooLargeError    a record or message over its size limit
    ├── CapacityError               a configured bound is reached; counted where it is hit
    │   └── OutboxFullError         the disk budget cannot take this record
    ├── StorageError                local state on disk is unusable as it stands;
    │   │                           nothing is deleted, the agent decides what to do
    │   ├── OutboxCorruptError      not an outbox, or fails SQLite's integrity check
    │   ├── OutboxVersionError      written by a newer agent (unknown schema version)
    │   ├── OutboxInUseError        another process holds the outbox open
    │   └── OutboxNodeMismatchError the outbox belongs to another node id
    └── ClosedError                 used after ``close()``

Every error carries structured ``fields`` (path, sizes, counters) for logs and alarms.
This module imports nothing from ``control_plane``: the two packages never share code.
"""

from __future__ import annotations

from typing import Any


class EdgeNodeError(Exception):
    """Root of the edge node's errors."""

    title = "edge node error"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = fields


class InvalidInputError(EdgeNodeError):
    title = "invalid input"


class PayloadTooLargeError(InvalidInputError):
    title = "payload too large"


class CapacityError(EdgeNodeError):
    title = "capacity reached"


class OutboxFullError(CapacityError):
    title = "outbox full"


class StorageError(EdgeNodeError):
    title = "local storage failure"


class OutboxCorruptError(StorageError):
    title = "outbox corrupt"


class OutboxVersionError(StorageError):
    title = "outbox schema version unknown"


class OutboxInUseError(StorageError):
    title = "outbox in use"


class OutboxNodeMismatchError(StorageError):
    title = "outbox belongs to another node"


class ClosedError(EdgeNodeError):
    title = "closed"
