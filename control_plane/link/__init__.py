"""The control plane's side of the node link: ingestion, gRPC server, MQTT bridge."""
