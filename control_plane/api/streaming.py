"""Bridges between Starlette's async request/response streams and the sync stores."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from starlette.responses import Response, StreamingResponse

from control_plane.errors import InvalidInputError

T = TypeVar("T")

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
READ_AHEAD_BATCHES = 4
BATCH_BYTES = 1 << 20


async def consume_in_thread(
    stream: AsyncIterator[bytes], consumer: Callable[[Iterator[bytes]], T]
) -> T:
    """Run `consumer` in a worker thread, feeding it the async byte stream.

    A reader task stays a few batches ahead (bounded: READ_AHEAD_BATCHES x BATCH_BYTES),
    so receiving on the event loop overlaps with hashing and writing in the thread, and
    the thread crosses back to the loop once per ~1 MiB rather than once per chunk.
    An error while reading (client gone, body over the limit) is raised in the consumer.
    """
    send, receive = anyio.create_memory_object_stream[list[bytes] | Exception](READ_AHEAD_BATCHES)

    async def read_ahead() -> None:
        async with send:
            batch: list[bytes] = []
            size = 0
            try:
                async for chunk in stream:
                    if not chunk:
                        continue
                    batch.append(chunk)
                    size += len(chunk)
                    if size >= BATCH_BYTES:
                        await send.send(batch)
                        batch, size = [], 0
                if batch:
                    await send.send(batch)
            except Exception as exc:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await send.send(exc)

    def chunks() -> Iterator[bytes]:
        while True:
            try:
                item = anyio.from_thread.run(receive.receive)
            except anyio.EndOfStream:
                return
            if isinstance(item, Exception):
                raise item
            yield from item

    results: list[T] = []
    failure: Exception | None = None
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_ahead)
        try:
            results.append(await anyio.to_thread.run_sync(consumer, chunks()))
        except Exception as exc:
            # Raised below, outside the task group, so callers see the domain error
            # itself rather than an ExceptionGroup.
            failure = exc
        finally:
            # The consumer may stop early (a hash mismatch): stop reading too.
            tasks.cancel_scope.cancel()
            receive.close()
    if failure is not None:
        raise failure
    return results[0]


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


_BYTES = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
# The OpenAPI responses of a route answered by `artifact_response` (with
# `response_class=Response`: FastAPI would otherwise document JSON).
ARTIFACT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The whole artifact.", "content": _BYTES},
    206: {"description": "The requested byte range.", "content": _BYTES},
    416: {"description": "The range is not satisfiable (no body; see Content-Range)."},
}


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
