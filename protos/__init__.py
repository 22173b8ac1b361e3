"""Wire contracts shared by both sides: generated fleet protobuf code and the latency sketch."""
