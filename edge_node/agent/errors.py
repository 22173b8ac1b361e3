"""Why the agent stopped, and the process exit code each reason maps to.

    AgentError              the agent cannot go on (exit 1)
    ├── EnrollmentError     first start could not enroll (no token/CA, token refused)
    ├── TaskFailedError     a supervised task failed (outbox corrupt, model unloadable, ...)
    └── NodeRefusedError    the control plane refuses this node: revoked or unknown (exit 3)

Exit code 2 (bad configuration) is `edge_node.config.ConfigError`; 0 is a clean drain.
"""

from __future__ import annotations

from typing import Final

from edge_node.errors import EdgeNodeError

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "AgentError",
    "EnrollmentError",
    "NodeRefusedError",
    "TaskFailedError",
]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_CONFIG: Final = 2
EXIT_REFUSED: Final = 3


class AgentError(EdgeNodeError):
    title = "agent stopped"
    exit_code: int = EXIT_FAILED


class EnrollmentError(AgentError):
    title = "enrollment failed"


class TaskFailedError(AgentError):
    title = "agent task failed"


class NodeRefusedError(AgentError):
    """Revoked or unknown: restarting will not help; enroll the node again."""

    title = "node refused by the control plane"
    exit_code = EXIT_REFUSED
