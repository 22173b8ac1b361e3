"""A fake IP camera on loopback: serves a JPEG snapshot, or fails the way cameras do."""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

import numpy as np
from PIL import Image

Mode = Literal["ok", "error", "garbage", "slow", "html"]


def jpeg(value: int = 128, size: tuple[int, int] = (8, 8)) -> bytes:
    pixels = np.full((size[0], size[1], 3), value, dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()


@dataclass
class FakeCamera:
    mode: Mode = "ok"
    credentials: tuple[str, str] | None = None
    slow_s: float = 2.0
    requests: list[float] = field(default_factory=list)  # monotonic times
    port: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cgi-bin/snapshot.cgi"


def _handler(camera: FakeCamera) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str = "image/jpeg") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            camera.requests.append(time.monotonic())
            if camera.credentials is not None:
                token = base64.b64encode(":".join(camera.credentials).encode()).decode()
                if self.headers.get("Authorization") != f"Basic {token}":
                    self._send(401, b"", "text/plain")
                    return
            mode = camera.mode
            if mode == "error":
                self._send(500, b"internal error", "text/plain")
            elif mode == "garbage":
                self._send(200, b"\xff\xd8\xff\xe0 this is not a jpeg at all")
            elif mode == "html":
                self._send(200, b"<html>login</html>", "text/html")
            elif mode == "slow":
                camera._stop.wait(camera.slow_s)  # bounded: the server's stop cuts it short
                self._send(200, jpeg())
            else:
                self._send(200, jpeg())

    return Handler


@contextmanager
def fake_camera(**options: object) -> Iterator[FakeCamera]:
    camera = FakeCamera(**options)  # type: ignore[arg-type]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(camera))
    server.daemon_threads = True
    camera.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield camera
    finally:
        camera._stop.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
