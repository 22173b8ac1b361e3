"""``S3ArtifactStore``: the artifact store on S3 or any S3-compatible service, via a boto3 client.

Production storage; it hands out presigned GET URLs. It does not create buckets or set
lifecycle rules (configure ``AbortIncompleteMultipartUpload`` on the bucket as a backstop).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Literal, NoReturn, TypedDict

from botocore.exceptions import BotoCoreError, ClientError

from control_plane.artifacts.base import (
    DEFAULT_MAX_LENGTH,
    MAX_BUFFER_SIZE,
    ArtifactStore,
    check_sha256,
)
from control_plane.errors import NotFoundError, StorageError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

__all__ = ["MIN_PART_SIZE", "S3ArtifactStore"]

logger = logging.getLogger(__name__)

MIN_PART_SIZE = 5 << 20
"""S3's smallest allowed multipart part (every part but the last)."""

_MAX_PARTS = 10_000
_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


class _ChecksumArgs(TypedDict, total=False):
    ChecksumAlgorithm: Literal["CRC32"]


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3ArtifactStore(ArtifactStore):
    """Artifacts as objects ``<prefix>sha256/<hex>`` in one bucket.

    Uploads up to ``part_size`` are buffered and sent with one ``PutObject``; larger ones
    go through a multipart upload of ``part_size`` parts that is completed only after the
    whole stream was verified and aborted on any failure, so no object is ever visible
    before verification. At most ``part_size`` bytes are buffered per upload.
    """

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        prefix: str = "artifacts/",
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        part_size: int = MAX_BUFFER_SIZE,
    ) -> None:
        super().__init__(max_length=max_length)
        if not bucket:
            raise ValueError("bucket must not be empty")
        if not MIN_PART_SIZE <= part_size <= MAX_BUFFER_SIZE:
            raise ValueError(
                f"part_size must be between {MIN_PART_SIZE} and {MAX_BUFFER_SIZE}, got {part_size}"
            )
        if max_length > part_size * _MAX_PARTS:
            raise ValueError(
                f"max_length {max_length} needs more than {_MAX_PARTS} parts of {part_size} bytes"
            )
        prefix = prefix.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self._client = client
        self._bucket = bucket
        self._prefix = prefix
        self._part_size = part_size
        # Do what boto3's own transfer manager does: when the client adds flexible checksums
        # (botocore's default, "when_supported"), create the multipart upload with CRC32, send
        # it per part and repeat the values on completion; otherwise use none of them, which
        # is what S3-compatible servers configured with "when_required" expect.
        calculation = getattr(client.meta.config, "request_checksum_calculation", None)
        self._part_checksums = calculation in (None, "when_supported")

    @property
    def client(self) -> S3Client:
        return self._client

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def part_size(self) -> int:
        return self._part_size

    def key_of(self, sha256: str) -> str:
        """The object key of an artifact."""
        return f"{self._prefix}sha256/{check_sha256(sha256)}"

    # -- adapter hooks --------------------------------------------------------------------------

    def _put(self, sha256: str, length: int, chunks: Iterator[bytes]) -> None:
        key = self.key_of(sha256)
        if length > self._part_size:
            self._put_multipart(sha256, key, chunks)
            return
        body = io.BytesIO()
        for chunk in chunks:
            body.write(chunk)
        # ``chunks`` is exhausted, hence verified: only now may the object appear.
        body.seek(0)
        try:
            self._client.put_object(
                Bucket=self._bucket,
                Key=key,
                Body=body,
                ContentLength=length,
                ContentType="application/octet-stream",
            )
        except (BotoCoreError, ClientError) as exc:
            self._raise_storage_error("store", sha256, exc)

    def _put_multipart(self, sha256: str, key: str, chunks: Iterator[bytes]) -> None:
        upload_id: str | None = None
        parts: list[CompletedPartTypeDef] = []
        part = io.BytesIO()
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                while len(view):
                    room = self._part_size - part.tell()
                    part.write(view[:room])
                    view = view[room:]
                    if part.tell() == self._part_size:
                        if upload_id is None:
                            upload_id = self._create_multipart_upload(sha256, key)
                        parts.append(
                            self._upload_part(sha256, key, upload_id, len(parts) + 1, part)
                        )
                        part = io.BytesIO()
            # ``chunks`` is exhausted, hence verified: upload the tail and publish.
            if upload_id is None:
                upload_id = self._create_multipart_upload(sha256, key)
            if part.tell() or not parts:
                parts.append(self._upload_part(sha256, key, upload_id, len(parts) + 1, part))
            try:
                self._client.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
            except (BotoCoreError, ClientError) as exc:
                self._raise_storage_error("complete upload of", sha256, exc)
        except BaseException:
            if upload_id is not None:
                self._abort_multipart_upload(key, upload_id)
            raise

    def _create_multipart_upload(self, sha256: str, key: str) -> str:
        try:
            response = self._client.create_multipart_upload(
                Bucket=self._bucket,
                Key=key,
                ContentType="application/octet-stream",
                **self._checksum_args(),
            )
        except (BotoCoreError, ClientError) as exc:
            self._raise_storage_error("start upload of", sha256, exc)
        return response["UploadId"]

    def _upload_part(
        self, sha256: str, key: str, upload_id: str, number: int, body: io.BytesIO
    ) -> CompletedPartTypeDef:
        length = body.tell()
        body.seek(0)
        try:
            response = self._client.upload_part(
                Bucket=self._bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
                ContentLength=length,
                **self._checksum_args(),
            )
        except (BotoCoreError, ClientError) as exc:
            self._raise_storage_error("upload a part of", sha256, exc)
        completed: CompletedPartTypeDef = {"PartNumber": number, "ETag": response["ETag"]}
        if self._part_checksums and "ChecksumCRC32" in response:
            completed["ChecksumCRC32"] = response["ChecksumCRC32"]
        return completed

    def _checksum_args(self) -> _ChecksumArgs:
        return {"ChecksumAlgorithm": "CRC32"} if self._part_checksums else {}

    def _abort_multipart_upload(self, key: str, upload_id: str) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=key, UploadId=upload_id)
        except (BotoCoreError, ClientError):
            # The original failure matters more; the parts stay invisible (no object exists)
            # until the bucket's lifecycle rule reaps them.
            logger.warning(
                "could not abort multipart upload %s of %s/%s",
                upload_id,
                self._bucket,
                key,
                exc_info=True,
            )

    def _open_range(
        self, sha256: str, start: int, end: int, chunk_size: int
    ) -> Generator[bytes, None, None]:
        try:
            response = self._client.get_object(
                Bucket=self._bucket, Key=self.key_of(sha256), Range=f"bytes={start}-{end - 1}"
            )
        except (BotoCoreError, ClientError) as exc:
            self._raise_storage_error("read", sha256, exc)
        body = response["Body"]
        try:
            pieces = body.iter_chunks(chunk_size)
            while True:
                try:
                    piece = next(pieces)
                except StopIteration:
                    return
                except BotoCoreError as exc:
                    self._raise_storage_error("read", sha256, exc)
                yield piece
        finally:
            body.close()

    def _size(self, sha256: str) -> int | None:
        try:
            response = self._client.head_object(Bucket=self._bucket, Key=self.key_of(sha256))
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND_CODES:
                return None
            self._raise_storage_error("inspect", sha256, exc)
        except BotoCoreError as exc:
            self._raise_storage_error("inspect", sha256, exc)
        return response["ContentLength"]

    def _delete(self, sha256: str) -> None:
        try:
            self._client.delete_object(Bucket=self._bucket, Key=self.key_of(sha256))
        except (BotoCoreError, ClientError) as exc:
            self._raise_storage_error("delete", sha256, exc)

    def _download_url(self, sha256: str, expires_s: int) -> str | None:
        try:
            return self._client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self._bucket, "Key": self.key_of(sha256)},
                ExpiresIn=expires_s,
            )
        except (BotoCoreError, ClientError) as exc:
            self._raise_storage_error("sign a URL for", sha256, exc)

    def _raise_storage_error(
        self, action: str, sha256: str, exc: BotoCoreError | ClientError
    ) -> NoReturn:
        code = _error_code(exc) if isinstance(exc, ClientError) else type(exc).__name__
        if isinstance(exc, ClientError) and code in _NOT_FOUND_CODES:
            raise NotFoundError("artifact not found", sha256=sha256) from exc
        raise StorageError(
            f"S3 artifact store could not {action} artifact {sha256} ({code})",
            sha256=sha256,
            operation=action,
            code=code,
        ) from exc

    def __repr__(self) -> str:
        return (
            f"S3ArtifactStore(bucket={self._bucket!r}, prefix={self._prefix!r}, "
            f"max_length={self.max_length}, part_size={self._part_size})"
        )
