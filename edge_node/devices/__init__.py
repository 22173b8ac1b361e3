"""The edge node's side of the device contract (device.proto, the SDK's topics): cameras'
messages in from the local broker, `Observation`s out to the aggregation, and the node's
replies (each camera's `DeviceConfig`, `TimeSync` answers to heartbeats) back.

Pure cores: ``config`` (the gateway's settings, parsed), ``intake`` (decode, validate,
rate-limit and dedupe one message; what to answer), ``limits`` (token buckets, the
recent-id memory), ``replies`` (the node's messages). One adapter: ``gateway``
(`DeviceGateway`, paho). Importing this package starts nothing and imports none of them.
"""
