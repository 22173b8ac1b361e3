"""A camera as a process of its own, for tests that SIGKILL it (a device reboot).

``python -m tests.edge_node.devices.camera_process PORT DEVICE RING FIRST COUNT`` starts a
`DeviceClient` with a file ring in RING, buffers COUNT results (frame sequences FIRST
on), printing ``id <frame> <message id>`` for each, then ``buffered``, then ``queued <n>``
every 50 ms until it is killed (or has run 60 s). The broker may be down throughout.
"""

from __future__ import annotations

import sys
import time

from device_sdk.backoff import BackoffPolicy
from device_sdk.client import ClientConfig, Detection, DeviceClient
from device_sdk.transport import MqttSettings


def main(argv: list[str]) -> int:
    port, device, ring, first, count = argv
    client = DeviceClient(
        ClientConfig(
            device,
            mqtt=MqttSettings(port=int(port)),
            backoff=BackoffPolicy(base_s=0.05, cap_s=0.2),
            ring_directory=ring,
            connect_timeout_s=1.0,
        )
    )
    client.start()
    person = Detection("person", 0.9, (0.1, 0.1, 0.3, 0.9), track_id=4)
    for seq in range(int(first), int(first) + int(count)):
        message_id = client.publish_result(seq, time.time(), [person])
        print(f"id {seq} {message_id}", flush=True)
    print("buffered", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        print(f"queued {client.stats().buffer.queued_messages}", flush=True)
        time.sleep(0.05)
    client.close(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
