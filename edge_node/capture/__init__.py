"""Camera capture: feeds the runtime's streams from HTTP snapshot URLs and drop directories.

``config`` and ``schedule`` are pure (parsing, pacing, backoff, which file to take);
``sources`` holds the I/O adapters and ``service`` the loops the agent supervises.
"""

from edge_node.capture.config import (
    DEFAULT_FPS,
    SUPPORTED_SCHEMES,
    CaptureConfigError,
    Credentials,
    DirectorySourceConfig,
    HttpSourceConfig,
    SourceConfig,
    StreamSource,
    parse_credentials,
    parse_source,
)
from edge_node.capture.schedule import CaptureStats
from edge_node.capture.service import CaptureService, FrameSink
from edge_node.capture.sources import CaptureError, Snapshot, SnapshotSource

__all__ = [
    "DEFAULT_FPS",
    "SUPPORTED_SCHEMES",
    "CaptureConfigError",
    "CaptureError",
    "CaptureService",
    "CaptureStats",
    "Credentials",
    "DirectorySourceConfig",
    "FrameSink",
    "HttpSourceConfig",
    "Snapshot",
    "SnapshotSource",
    "SourceConfig",
    "StreamSource",
    "parse_credentials",
    "parse_source",
]
