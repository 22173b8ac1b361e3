"""The live-server fixtures live one level up, shared with the CLI tests."""

from tests.control_plane.conftest import LiveServer

__all__ = ["LiveServer"]
