"""Bridges between Starlette's async request/response streams and the sync stores."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from starlette.responses import Response, StreamingResponse

from control_plane.errors import InvalidInputError

T = TypeVar("T")

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


async def consume_in_thread(
    stream: AsyncIterator[bytes], consumer: Callable[[Iterator[bytes]], T]
) -> T:
    """Run `consumer` in a worker thread, feeding it the async byte stream chunk by chunk."""

    async def next_chunk() -> bytes | None:
        try:
            return await anext(stream)
        except StopAsyncIteration:
            return None

    def chunks() -> Iterator[bytes]:
        while (chunk := anyio.from_thread.run(next_chunk)) is not None:
            if chunk:
                yield chunk

    return await anyio.to_thread.run_sync(consumer, chunks())


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """One RFC 9110 byte range -> [start, end) or None for the whole file.

    Raises InvalidInputError(unsatisfiable=True) for a range outside the file.
    Multi-range requests are answered with the whole file, which RFC 9110 allows.
    """
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:
        suffix = int(last)
        if suffix == 0:
            raise InvalidInputError("empty suffix range", unsatisfiable=True, size=size)
        return max(0, size - suffix), size
    start = int(first)
    end = min(int(last) + 1, size) if last else size
    if start >= size or (last and int(last) < start):
        raise InvalidInputError(
            f"range {header!r} not satisfiable for {size} bytes", unsatisfiable=True, size=size
        )
    return start, end


def artifact_response(
    open_range: Callable[[int, int], Iterator[bytes]],
    size: int,
    range_header: str | None,
    *,
    etag: str,
    media_type: str = "application/octet-stream",
) -> Response:
    """A 200 or 206 streaming response for bytes of an artifact; 416 when unsatisfiable."""
    try:
        span = parse_range(range_header, size)
    except InvalidInputError:
        return Response(status_code=416, headers={"Content-Range": f"bytes */{size}"})
    headers = {"Accept-Ranges": "bytes", "ETag": f'"{etag}"'}
    if span is None:
        headers["Content-Length"] = str(size)
        return StreamingResponse(open_range(0, size), 200, headers=headers, media_type=media_type)
    start, end = span
    headers["Content-Length"] = str(end - start)
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    return StreamingResponse(open_range(start, end), 206, headers=headers, media_type=media_type)
