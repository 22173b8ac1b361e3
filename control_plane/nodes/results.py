"""What a node's model saw: its newest sampled inference results, for operators.

Reads ``node_results`` (written by the record ingest, which keeps the newest K per node):
newest first, optionally of one stream. Not here: storing or pruning them
(``control_plane.link.ingest``), reading the wire document (``control_plane.link.records``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.errors import InvalidInputError
from control_plane.nodes.rows import node_row
from control_plane.storage.models import NodeResultRow

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "NodeResult", "NodeResults"]

DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True)
class NodeResult:
    """One stored result: the columns, and the document as the node sent it (read)."""

    node_id: str
    record_id: str
    seq: int
    received_at: datetime
    captured_at: datetime
    stream: str
    model: str
    version: str | None
    kind: str
    document: dict[str, Any]

    @property
    def model_label(self) -> str:
        """``name@version``, or the name of a model served from a local file."""
        return self.model if self.version is None else f"{self.model}@{self.version}"


class NodeResults:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def recent(
        self, node_id: str, *, limit: int = DEFAULT_LIMIT, stream: str | None = None
    ) -> list[NodeResult]:
        """The node's newest results (by its sequence), at most `limit`; NotFoundError for
        an unknown node, InvalidInputError (``bad-limit``) for a limit out of range."""
        if isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidInputError(
                f"limit must be in [1, {MAX_LIMIT}], got {limit}", reason="bad-limit", limit=limit
            )
        query = (
            select(NodeResultRow)
            .where(NodeResultRow.node_id == node_id)
            .order_by(NodeResultRow.seq.desc())
            .limit(limit)
        )
        if stream is not None:
            query = query.where(NodeResultRow.stream == stream)
        with self._sessions() as session:
            node_row(session, node_id)  # an unknown node is a 404, not an empty list
            return [
                NodeResult(
                    node_id=row.node_id,
                    record_id=row.record_id,
                    seq=row.seq,
                    received_at=row.received_at,
                    captured_at=row.captured_at,
                    stream=row.stream,
                    model=row.model,
                    version=row.version,
                    kind=row.kind,
                    document=dict(row.document),
                )
                for row in session.scalars(query)
            ]
