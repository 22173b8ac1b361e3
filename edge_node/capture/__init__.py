"""Camera capture: feeds the runtime's streams from HTTP snapshot URLs and drop directories.

``config`` and ``schedule`` are pure (parsing, pacing, backoff, which file to take);
``sources`` holds the I/O adapters and ``service`` the loops the agent supervises.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

# Public name -> (module, attribute), loaded on first use (PEP 562)
# so that importing a pure submodule (`config`, `schedule`) does not load httpx
# through this package.
_EXPORTS: dict[str, tuple[str, str]] = {
    "DEFAULT_FPS": ("edge_node.capture.config", "DEFAULT_FPS"),
    "SUPPORTED_SCHEMES": ("edge_node.capture.config", "SUPPORTED_SCHEMES"),
    "CaptureConfigError": ("edge_node.capture.config", "CaptureConfigError"),
    "CaptureError": ("edge_node.capture.sources", "CaptureError"),
    "CaptureService": ("edge_node.capture.service", "CaptureService"),
    "CaptureStats": ("edge_node.capture.schedule", "CaptureStats"),
    "Credentials": ("edge_node.capture.config", "Credentials"),
    "DirectorySourceConfig": ("edge_node.capture.config", "DirectorySourceConfig"),
    "FrameSink": ("edge_node.capture.service", "FrameSink"),
    "HttpSourceConfig": ("edge_node.capture.config", "HttpSourceConfig"),
    "Snapshot": ("edge_node.capture.sources", "Snapshot"),
    "SnapshotSource": ("edge_node.capture.sources", "SnapshotSource"),
    "SourceConfig": ("edge_node.capture.config", "SourceConfig"),
    "StreamSource": ("edge_node.capture.config", "StreamSource"),
    "parse_credentials": ("edge_node.capture.config", "parse_credentials"),
    "parse_source": ("edge_node.capture.config", "parse_source"),
}


def __getattr__(name: str) -> object:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
