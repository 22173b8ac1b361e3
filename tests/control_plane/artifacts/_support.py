"""Helpers shared by the artifact store tests: deterministic data and an S3 test client."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from control_plane.artifacts import ArtifactStore

MiB = 1 << 20
S3_TEST_PART_SIZE = 5 * MiB  # S3's minimum, so a ~12 MiB artifact takes three parts


@dataclass
class StoreKit:
    kind: str
    make: Callable[..., ArtifactStore]
    leftovers: Callable[[], list[str]]
    """Everything the backend holds: stored objects, temp files, pending multipart uploads."""


def s3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chunked(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def random_bytes(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


@dataclass(frozen=True)
class BigArtifact:
    """~12 MiB produced chunk by chunk, in odd-sized chunks that straddle part boundaries."""

    chunk_size: int = 1_048_573  # prime: chunks never line up with 5 MiB parts
    chunks_count: int = 12
    seed: int = 7

    def chunks(self) -> Iterator[bytes]:
        rng = random.Random(self.seed)
        for _ in range(self.chunks_count):
            yield rng.randbytes(self.chunk_size)

    @property
    def length(self) -> int:
        return self.chunk_size * self.chunks_count

    @property
    def sha256(self) -> str:
        digest = hashlib.sha256()
        for chunk in self.chunks():
            digest.update(chunk)
        return digest.hexdigest()

    def slice(self, start: int, end: int) -> bytes:
        """The bytes [start, end), regenerated."""
        out = bytearray()
        offset = 0
        for chunk in self.chunks():
            lo, hi = max(start - offset, 0), min(end - offset, len(chunk))
            if lo < hi:
                out += chunk[lo:hi]
            offset += len(chunk)
        return bytes(out)


def read_all(chunks: Iterator[bytes]) -> bytes:
    return b"".join(chunks)
