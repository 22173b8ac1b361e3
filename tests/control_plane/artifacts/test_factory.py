"""artifact_store_from_url: both URL forms, and clear refusals of the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from control_plane.artifacts import LocalArtifactStore, S3ArtifactStore, artifact_store_from_url
from control_plane.errors import InvalidInputError
from tests.control_plane.artifacts._support import chunked, random_bytes, read_all, sha


def test_file_url(tmp_path: Path) -> None:
    store = artifact_store_from_url(f"file://{tmp_path}/store", max_length=123)
    assert isinstance(store, LocalArtifactStore)
    assert store.root == tmp_path / "store"
    assert store.max_length == 123
    assert (tmp_path / "store" / "tmp").is_dir()


def test_file_url_with_localhost_and_escapes(tmp_path: Path) -> None:
    store = artifact_store_from_url(f"file://localhost{tmp_path}/my%20store")
    assert isinstance(store, LocalArtifactStore)
    assert store.root == tmp_path / "my store"


def test_plain_absolute_path(tmp_path: Path) -> None:
    store = artifact_store_from_url(str(tmp_path / "plain"))
    assert isinstance(store, LocalArtifactStore)
    assert store.root == tmp_path / "plain"


def test_plain_relative_path_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = artifact_store_from_url("data/artifacts")
    assert isinstance(store, LocalArtifactStore)
    assert store.root == tmp_path / "data" / "artifacts"


def test_s3_url() -> None:
    store = artifact_store_from_url(
        "s3://models-bucket/fleet/a?endpoint_url=http://127.0.0.1:9000&region=eu-west-1",
        max_length=1 << 30,
    )
    assert isinstance(store, S3ArtifactStore)
    assert store.bucket == "models-bucket"
    assert store.prefix == "fleet/a/"
    assert store.max_length == 1 << 30
    assert store.client.meta.endpoint_url == "http://127.0.0.1:9000"
    assert store.client.meta.region_name == "eu-west-1"
    assert cast(Any, store.client.meta.config).s3 == {"addressing_style": "path"}


def test_s3_url_without_prefix_uses_the_default() -> None:
    store = artifact_store_from_url("s3://models-bucket?region=us-east-1")
    assert isinstance(store, S3ArtifactStore)
    assert store.prefix == "artifacts/"
    assert cast(Any, store.client.meta.config).s3 == {"addressing_style": "auto"}


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "http://example.com/artifacts",
        "gs://bucket/prefix",
        "ftp:///srv/artifacts",
        "file://otherhost/srv/artifacts",
        "file:relative/path",
        "file:///srv/artifacts?x=1",
        "s3://",
        "s3:///prefix",
        "s3://Bad_Bucket/prefix",
        "s3://bucket/prefix?endpoint=http://x",  # typo of endpoint_url
        "s3://bucket/prefix?region=a&region=b",
        "s3://bucket/prefix?region=",
        "s3://bucket/prefix?endpoint_url=localhost:9000",
        "s3://bucket/prefix?addressing_style=sideways",
    ],
)
def test_refused_urls(url: str) -> None:
    with pytest.raises(InvalidInputError):
        artifact_store_from_url(url)


@pytest.mark.s3
def test_s3_url_store_works_against_a_server(
    s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    store = artifact_store_from_url(
        f"s3://{s3_bucket}/models?endpoint_url={s3_endpoint}&region=us-east-1"
    )
    data = random_bytes(5000)
    assert store.put(sha(data), len(data), chunked(data, 999)) is True
    assert read_all(store.open_range(sha(data), 10, 20)) == data[10:20]
