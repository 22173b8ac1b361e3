"""The node agent: one supervised process (enrollment, uplink, renewal, health, runtime).

Importing this package starts nothing; `python -m edge_node run` is the entry point.
"""

from __future__ import annotations

from edge_node.agent.agent import HEALTH_SCHEMA, Agent, AgentContext, Component
from edge_node.agent.errors import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    AgentError,
    EnrollmentError,
    NodeRefusedError,
    TaskFailedError,
)

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "HEALTH_SCHEMA",
    "Agent",
    "AgentContext",
    "AgentError",
    "Component",
    "EnrollmentError",
    "NodeRefusedError",
    "TaskFailedError",
]
