"""The camera-side client (its own distribution, `edgefleet-device`: paho-mqtt + protobuf).

`device_sdk.client.DeviceClient` publishes the v1 device contract (`device_sdk.proto`)
to an edge node; `device_sdk.testing` is an in-process broker for firmware tests. This
file stays empty of imports: the pure cores (buffer, backoff, pacing) load without paho.
It imports nothing of the fleet.
"""

__version__ = "0.1.0"
