"""`ModelHost`: the one port through which an update reaches the model that serves.

The reconciler hands it a verified model to serve (a trial's activation, a revert);
the agent's update task serves the journal's model through it at start and reads the
served model's run counters for the watchdog. The agent's runtime implements it
(`edge_node.agent.runtime_host.RuntimeHost`). Not here: loading sessions, hot swap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from edge_node.updater.watchdog import ModelHealth

__all__ = ["ModelHost"]


class ModelHost(Protocol):
    async def serve(self, path: Path) -> None:
        """Serve the model at `path` from now on (start the runtime, or hot-swap).

        Raises when it cannot (it does not load, the node is stopping): the model that
        served before keeps serving then.
        """
        ...

    def health(self) -> ModelHealth | None:
        """Run counters of the model serving now (None before any serves)."""
        ...
