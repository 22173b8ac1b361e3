"""S3-only behaviour: object layout, multipart, presigned URLs, backend failures (moto)."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any, cast

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from control_plane.artifacts import S3ArtifactStore
from control_plane.errors import NotFoundError, StorageError
from tests.control_plane.artifacts._support import (
    S3_TEST_PART_SIZE,
    BigArtifact,
    MiB,
    chunked,
    random_bytes,
    read_all,
    s3_client,
    sha,
)

pytestmark = pytest.mark.s3

DATA = random_bytes(10_000)
DATA_SHA = sha(DATA)
BIG = BigArtifact()


@pytest.fixture
def client(s3_endpoint: str) -> Any:
    return s3_client(s3_endpoint)


def test_objects_are_keyed_by_prefix_and_hash(client: Any, s3_bucket: str) -> None:
    store = S3ArtifactStore(client, s3_bucket, "/fleet-a/models")  # normalised to "fleet-a/models/"
    assert store.prefix == "fleet-a/models/"
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys == [f"fleet-a/models/sha256/{DATA_SHA}"]
    assert store.key_of(DATA_SHA) == keys[0]


def test_small_artifact_is_one_put_and_big_one_is_multipart(client: Any, s3_bucket: str) -> None:
    store = S3ArtifactStore(client, s3_bucket, part_size=S3_TEST_PART_SIZE)
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    store.put(BIG.sha256, BIG.length, BIG.chunks())
    small_etag = client.head_object(Bucket=s3_bucket, Key=store.key_of(DATA_SHA))["ETag"]
    big_etag = client.head_object(Bucket=s3_bucket, Key=store.key_of(BIG.sha256))["ETag"]
    assert "-" not in small_etag
    assert big_etag.strip('"').endswith("-3")  # 12 MiB in 5 MiB parts
    assert sha(read_all(store.open_range(BIG.sha256))) == BIG.sha256


def test_exact_multiple_of_part_size(client: Any, s3_bucket: str) -> None:
    data = random_bytes(2 * S3_TEST_PART_SIZE, seed=3)
    store = S3ArtifactStore(client, s3_bucket, part_size=S3_TEST_PART_SIZE)
    assert store.put(sha(data), len(data), chunked(data, 1 * MiB)) is True
    assert read_all(store.open_range(sha(data))) == data


def test_without_flexible_checksums(s3_endpoint: str, s3_bucket: str) -> None:
    """S3-compatible servers often need request_checksum_calculation='when_required'."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(
            s3={"addressing_style": "path"}, request_checksum_calculation="when_required"
        ),
    )
    store = S3ArtifactStore(client, s3_bucket, part_size=S3_TEST_PART_SIZE)
    assert store.put(BIG.sha256, BIG.length, BIG.chunks()) is True
    assert store.size(BIG.sha256) == BIG.length


def test_presigned_url_downloads_the_artifact(client: Any, s3_bucket: str) -> None:
    store = S3ArtifactStore(client, s3_bucket)
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    url = store.download_url(DATA_SHA, expires_s=120)
    assert url is not None
    assert "X-Amz-Expires=120" in url
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.read() == DATA


class FailingComplete:
    """The real client, except that completing a multipart upload fails."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def complete_multipart_upload(self, **kwargs: Any) -> Any:
        raise ClientError(
            {"Error": {"Code": "InternalError", "Message": "boom"}}, "CompleteMultipartUpload"
        )


def test_failed_completion_aborts_the_upload(client: Any, s3_bucket: str) -> None:
    store = S3ArtifactStore(
        cast(Any, FailingComplete(client)), s3_bucket, part_size=S3_TEST_PART_SIZE
    )
    with pytest.raises(StorageError) as caught:
        store.put(BIG.sha256, BIG.length, BIG.chunks())
    assert isinstance(caught.value.__cause__, ClientError)
    assert caught.value.fields["code"] == "InternalError"
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert client.list_objects_v2(Bucket=s3_bucket).get("Contents", []) == []


def test_missing_bucket_is_a_storage_error(client: Any) -> None:
    store = S3ArtifactStore(client, "no-such-bucket-here")
    with pytest.raises(StorageError) as caught:
        store.put(DATA_SHA, len(DATA), chunked(DATA))
    assert not isinstance(caught.value, NotFoundError)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_endpoint_is_a_storage_error_not_absence() -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{_closed_port()}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(connect_timeout=1, retries={"max_attempts": 1, "mode": "standard"}),
    )
    store = S3ArtifactStore(client, "unreachable")
    with pytest.raises(StorageError):
        store.size(DATA_SHA)
    with pytest.raises(StorageError):
        store.exists(DATA_SHA)
    with pytest.raises(StorageError):
        store.put(DATA_SHA, len(DATA), chunked(DATA))
    with pytest.raises(StorageError):
        store.delete(DATA_SHA)


@pytest.mark.parametrize("part_size", [S3_TEST_PART_SIZE - 1, 8 * MiB + 1])
def test_part_size_must_fit_s3_and_the_memory_budget(client: Any, part_size: int) -> None:
    with pytest.raises(ValueError, match="part_size"):
        S3ArtifactStore(client, "bucket", part_size=part_size)


def test_max_length_must_fit_in_ten_thousand_parts(client: Any) -> None:
    with pytest.raises(ValueError, match="parts"):
        S3ArtifactStore(client, "bucket", max_length=10_001 * 8 * MiB)
