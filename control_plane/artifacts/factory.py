"""Build an ``ArtifactStore`` from one configuration URL (``file://``, a path, or ``s3://``).

For entry points (``main()``, the FastAPI lifespan); it is the only place that builds boto3
clients for artifacts, and it imports boto3 only when an ``s3://`` URL asks for it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from control_plane.artifacts.base import DEFAULT_MAX_LENGTH, ArtifactStore
from control_plane.artifacts.local import LocalArtifactStore
from control_plane.errors import InvalidInputError

__all__ = ["artifact_store_from_url"]

_S3_OPTIONS = frozenset({"endpoint_url", "region", "addressing_style"})
_AddressingStyle = Literal["auto", "path", "virtual"]
_ADDRESSING_STYLES: dict[str, _AddressingStyle] = {
    "auto": "auto",
    "path": "path",
    "virtual": "virtual",
}
# Lenient on purpose (S3-compatible services accept more than AWS); rejects obvious typos.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")


def artifact_store_from_url(url: str, *, max_length: int = DEFAULT_MAX_LENGTH) -> ArtifactStore:
    """Return the store ``url`` names.

    - ``file:///abs/path`` or a plain path (``~`` expanded, made absolute): a
      ``LocalArtifactStore`` rooted there (directories are created).
    - ``s3://bucket[/prefix]?endpoint_url=http://127.0.0.1:9000&region=us-east-1``: an
      ``S3ArtifactStore`` (prefix defaults to ``artifacts/``) with a boto3 client whose
      credentials come from the standard environment / config chain. Optional
      ``addressing_style`` is ``auto``, ``path`` or ``virtual``; it defaults to ``path``
      when ``endpoint_url`` is given (MinIO and most S3-compatible servers want it).

    Anything else raises ``InvalidInputError``.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidInputError("artifact store URL must not be empty")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "":
        return LocalArtifactStore(Path(url).expanduser().absolute(), max_length=max_length)
    if scheme == "file":
        return _local_from_file_url(url, max_length)
    if scheme == "s3":
        return _s3_from_url(url, max_length)
    raise InvalidInputError(
        f"unsupported artifact store URL scheme {parts.scheme!r}; use file://, a path or s3://",
        url=url,
    )


def _local_from_file_url(url: str, max_length: int) -> ArtifactStore:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise InvalidInputError(
            "file URL must look like file:///absolute/path (no host, query or fragment)",
            url=url,
        )
    path = Path(unquote(parts.path))
    if not path.is_absolute():
        raise InvalidInputError("file URL must hold an absolute path", url=url)
    return LocalArtifactStore(path, max_length=max_length)


def _s3_from_url(url: str, max_length: int) -> ArtifactStore:
    parts = urlsplit(url)
    bucket = parts.netloc
    if not _BUCKET.fullmatch(bucket):
        raise InvalidInputError(
            "s3 URL must name a bucket: s3://bucket[/prefix][?endpoint_url=...&region=...]",
            url=url,
        )
    if parts.fragment:
        raise InvalidInputError("s3 URL must not have a fragment", url=url)
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise InvalidInputError(f"malformed s3 URL query: {exc}", url=url) from exc
    unknown = sorted(set(query) - _S3_OPTIONS)
    if unknown:
        raise InvalidInputError(
            f"unknown s3 URL option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(_S3_OPTIONS))}",
            url=url,
        )
    options: dict[str, str] = {}
    for name, values in query.items():
        if len(values) != 1 or not values[0]:
            raise InvalidInputError(f"s3 URL option {name} must be given once, non-empty", url=url)
        options[name] = values[0]

    endpoint_url = options.get("endpoint_url")
    if endpoint_url is not None:
        endpoint = urlsplit(endpoint_url)
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise InvalidInputError("endpoint_url must be an http(s) URL", url=url)
    addressing_style = _ADDRESSING_STYLES.get(
        options.get("addressing_style", "path" if endpoint_url else "auto")
    )
    if addressing_style is None:
        raise InvalidInputError(
            f"addressing_style must be one of {', '.join(sorted(_ADDRESSING_STYLES))}", url=url
        )
    prefix = unquote(parts.path).strip("/")

    # Deferred: the local store (and importing this module) must not pay for boto3.
    import boto3
    from botocore.config import Config

    from control_plane.artifacts.s3 import S3ArtifactStore

    # A session of our own: boto3's module-level default session is not thread-safe.
    session = boto3.session.Session(region_name=options.get("region"))
    client = session.client(
        "s3",
        endpoint_url=endpoint_url,
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": addressing_style},
            retries={"mode": "standard", "max_attempts": 5},
        ),
    )
    if prefix:
        return S3ArtifactStore(client, bucket, prefix + "/", max_length=max_length)
    return S3ArtifactStore(client, bucket, max_length=max_length)
