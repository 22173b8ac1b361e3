"""The aggregation's one error: a rules file that cannot be used as written.

Not for bad observations: those are counted by reason (``AlignerStats``), never raised.
"""

from __future__ import annotations

from edge_node.errors import InvalidInputError

__all__ = ["RulesConfigError"]


class RulesConfigError(InvalidInputError):
    """A rules document is malformed; ``fields["field"]`` names where (``rules[2].points``)."""

    title = "rules config invalid"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}", field=field, problem=problem)
        self.field = field
        self.problem = problem
