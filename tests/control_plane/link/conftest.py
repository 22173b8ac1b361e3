"""Node-service fixtures (real database, CA and manual clock) shared with the nodes tests."""

from tests.control_plane.nodes.conftest import (  # noqa: F401  (pytest fixtures)
    ca,
    clock,
    engine,
    fleets,
    nodes,
    sessions,
)
