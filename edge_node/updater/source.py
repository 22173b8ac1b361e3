"""`RepositorySource`: where the updater reads the fleet's TUF repository from.

Two methods of `NodeLink` and nothing else, so a gRPC node passes its link
(`FetchMetadata` / `FetchArtifact`) and an MQTT node, whose broker carries no models,
passes `edge_node.updater.https_fetch.HttpsRepository` (the control plane's TUF routes
over HTTPS). The errors are the link's: `LinkNotFoundError` for a file the repository
lacks, `LinkRequestError` for a refused request, `LinkUnavailableError` for an outage.
Not here: verification (python-tuf, `download`), which never trusts the source.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

__all__ = ["RepositorySource"]


class RepositorySource(Protocol):
    async def fetch_metadata(self, filename: str) -> bytes:
        """One TUF metadata file (`timestamp.json`, `2.snapshot.json`, ...)."""
        ...

    def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        """The target's bytes from `offset` on (a resumed download)."""
        ...
