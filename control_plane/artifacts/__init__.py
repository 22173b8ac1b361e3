"""Content-addressed artifact storage: the ``ArtifactStore`` port, its local and S3 adapters.

Stores bytes by sha256 and verifies them on the way in; knows nothing of models or TUF.
``S3ArtifactStore`` is loaded on first use so that importing the port does not import boto3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from control_plane.artifacts.base import (
    DEFAULT_MAX_LENGTH,
    MAX_BUFFER_SIZE,
    ArtifactStore,
    check_sha256,
)
from control_plane.artifacts.factory import artifact_store_from_url
from control_plane.artifacts.local import LocalArtifactStore

if TYPE_CHECKING:
    from control_plane.artifacts.s3 import S3ArtifactStore

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "MAX_BUFFER_SIZE",
    "ArtifactStore",
    "LocalArtifactStore",
    "S3ArtifactStore",
    "artifact_store_from_url",
    "check_sha256",
]


def __getattr__(name: str) -> object:
    if name == "S3ArtifactStore":
        from control_plane.artifacts.s3 import S3ArtifactStore

        return S3ArtifactStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
