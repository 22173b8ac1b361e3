"""The node agent: one supervised process (enrollment, uplink, renewal, health, runtime).

Importing this package starts nothing; `python -m edge_node run` is the entry point.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

# Public name -> (module, attribute), loaded on first use (PEP 562)
# so that importing one submodule does not load the whole agent (gRPC, MQTT,
# ONNX Runtime) through this package.
_EXPORTS: dict[str, tuple[str, str]] = {
    "EXIT_CONFIG": ("edge_node.agent.errors", "EXIT_CONFIG"),
    "EXIT_FAILED": ("edge_node.agent.errors", "EXIT_FAILED"),
    "EXIT_OK": ("edge_node.agent.errors", "EXIT_OK"),
    "EXIT_REFUSED": ("edge_node.agent.errors", "EXIT_REFUSED"),
    "HEALTH_SCHEMA": ("edge_node.agent.agent", "HEALTH_SCHEMA"),
    "Agent": ("edge_node.agent.agent", "Agent"),
    "AgentContext": ("edge_node.agent.agent", "AgentContext"),
    "AgentError": ("edge_node.agent.errors", "AgentError"),
    "Component": ("edge_node.agent.agent", "Component"),
    "EnrollmentError": ("edge_node.agent.errors", "EnrollmentError"),
    "NodeRefusedError": ("edge_node.agent.errors", "NodeRefusedError"),
    "TaskFailedError": ("edge_node.agent.errors", "TaskFailedError"),
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
