"""Fixtures for the artifact store tests: each contract test runs on the local and the S3 store.

``store_kit`` gives a store factory plus a view of the backend itself, so a test can check
that a failed upload left nothing behind: no object, no temp file, no multipart upload.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.artifacts import DEFAULT_MAX_LENGTH, ArtifactStore, LocalArtifactStore
from tests.control_plane.artifacts._support import S3_TEST_PART_SIZE, StoreKit, s3_client


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store_kit(request: pytest.FixtureRequest, tmp_path: Path) -> StoreKit:
    if request.param == "local":
        root = tmp_path / "artifacts"

        def make_local(max_length: int = DEFAULT_MAX_LENGTH) -> ArtifactStore:
            return LocalArtifactStore(root, max_length=max_length)

        def local_leftovers() -> list[str]:
            return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())

        return StoreKit("local", make_local, local_leftovers)

    from control_plane.artifacts import S3ArtifactStore

    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    client = s3_client(endpoint)

    def make_s3(max_length: int = DEFAULT_MAX_LENGTH) -> ArtifactStore:
        return S3ArtifactStore(client, bucket, max_length=max_length, part_size=S3_TEST_PART_SIZE)

    def s3_leftovers() -> list[str]:
        objects = client.list_objects_v2(Bucket=bucket).get("Contents", [])
        uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        return sorted(
            [f"object:{o['Key']}" for o in objects] + [f"upload:{u['Key']}" for u in uploads]
        )

    return StoreKit("s3", make_s3, s3_leftovers)


@pytest.fixture
def store(store_kit: StoreKit) -> ArtifactStore:
    return store_kit.make()
