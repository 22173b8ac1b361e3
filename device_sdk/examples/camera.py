"""A simulated camera: what firmware around `DeviceClient` looks like.

    python -m device_sdk.examples.camera --device cam-1 --frames 100 --fps 25 \\
        [--host 127.0.0.1 --port 1883 --mqtt 3.1.1 --ring /var/lib/cam/sdk]

It "detects" one vehicle crossing the frame (a track id, a plate), asks the SDK which
frames to process under the node's target fps, publishes the results, and sends a JPEG
only while the node asks for frames. Not a camera: no sensor, no model.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from device_sdk.client import ClientConfig, Detection, DeviceClient
from device_sdk.transport import Connector, MqttSettings

# The smallest JPEG a node would still take for one (SOI, APP0 marker, EOI).
TINY_JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9"


def detect(frame_seq: int, frames: int) -> list[Detection]:
    """Stand-in for the camera's model: a vehicle moving left to right."""
    x = 0.8 * frame_seq / max(frames - 1, 1)
    box = (x, 0.4, x + 0.2, 0.7)
    return [Detection("vehicle", 0.91, box, track_id=1, attributes={"plate_text": "AB123CD"})]


def run(
    config: ClientConfig,
    *,
    frames: int,
    fps: float,
    connector: Connector | None = None,
    realtime: bool = False,
) -> int:
    """Capture `frames` frames at `fps`; the number of results published."""
    published = 0
    with DeviceClient(config, connector=connector) as client:
        start = time.time()
        for frame_seq in range(frames):
            captured_at = start + frame_seq / fps
            if realtime:
                time.sleep(max(0.0, captured_at - time.time()))
            if not client.admit_frame(captured_at):
                continue  # the node wants fewer frames: skip the model entirely
            results = detect(frame_seq, frames)
            if client.publish_result(
                frame_seq, captured_at, results, model="toy-detector", model_version="1.0"
            ):
                published += 1
            client.publish_frame(frame_seq, captured_at, TINY_JPEG)  # None unless asked
        if not client.flush(timeout_s=10):
            print(f"not all sent yet; still buffered: {client.stats().buffer.queued_messages}")
    return published


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--mqtt", choices=("5", "3.1.1"), default="5")
    parser.add_argument("--username")
    parser.add_argument("--password")
    parser.add_argument("--ca-file", type=Path)
    parser.add_argument("--ring", type=Path, help="file-ring directory (survives reboots)")
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--fps", type=float, default=25.0)
    args = parser.parse_args(argv)
    config = ClientConfig(
        args.device,
        mqtt=MqttSettings(
            host=args.host,
            port=args.port,
            protocol=args.mqtt,
            username=args.username,
            password=args.password,
            ca_file=args.ca_file,
        ),
        ring_directory=args.ring,
    )
    sent = run(config, frames=args.frames, fps=args.fps, realtime=True)
    print(f"published {sent} of {args.frames} frames' results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
