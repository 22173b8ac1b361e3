"""Fakes and simulators that ship with the edge node, for tests, benchmarks and the demo fleet."""
