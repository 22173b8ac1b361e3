"""Node-service fixtures (real database, CA and manual clock), as the link tests use them."""

from tests.control_plane.nodes.conftest import (  # noqa: F401  (pytest fixtures)
    ca,
    clock,
    engine,
    fleets,
    nodes,
    sessions,
)
