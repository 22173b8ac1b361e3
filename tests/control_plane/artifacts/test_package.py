"""The package's public surface and its import-time promises."""

from __future__ import annotations

import subprocess
import sys

import control_plane.artifacts as artifacts


def test_all_names_are_exported() -> None:
    for name in artifacts.__all__:
        assert getattr(artifacts, name) is not None
    assert sorted(artifacts.__all__) == sorted(set(artifacts.__all__))


def test_importing_the_port_does_not_import_boto() -> None:
    """Pure cores may name ArtifactStore; they must not drag boto3/botocore in with it."""
    code = (
        "import sys, control_plane.artifacts; "
        "loaded = [m for m in ('boto3', 'botocore') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
