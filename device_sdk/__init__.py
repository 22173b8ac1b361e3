"""The camera-side client (its own distribution, `edgefleet-device`: paho-mqtt + protobuf).

Today only the v1 device contract (`device_sdk.proto`); it imports nothing of the fleet.
"""
