"""The device wire contract's .proto sources and generated code (`make protos`); no logic."""
