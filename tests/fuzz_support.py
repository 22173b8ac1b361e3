"""Hypothesis strategies for fuzzing the wire decoders: any bytes, and valid messages
mutated (bytes flipped, cut, inserted, spliced), with the suite's bounded settings.

A decoder under fuzz must refuse with its module's documented error or a counted
refusal, and never hang: `FUZZ` bounds the examples and each one's time."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = ["FUZZ", "mutated", "wire_bytes"]

# 200 examples a test, derandomized (the same inputs on every run and in CI), none
# slower than the deadline: a decoder that loops on some input fails, it does not hang.
FUZZ = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=timedelta(milliseconds=500),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def _mutation(draw: st.DrawFn, valid: bytes) -> bytes:
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(("flip", "set", "cut", "insert", "splice", "duplicate")))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[at] = draw(st.sampled_from((0x00, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x1A, 0x22)))
        elif op == "cut":
            data = data[:at]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "splice":
            end = draw(st.integers(at, len(data)))
            data[at:end] = draw(st.binary(max_size=16))
        elif op == "duplicate":
            end = draw(st.integers(at, len(data)))
            data[end:end] = data[at:end]
    return bytes(data)


def mutated(valid: bytes) -> st.SearchStrategy[bytes]:
    """`valid` after one to four random edits (a field tag, a length, a cut ...)."""
    return _mutation(valid)


def wire_bytes(*valid: bytes) -> st.SearchStrategy[bytes]:
    """Arbitrary bytes, or one of `valid` as it is or mutated."""
    return st.one_of(
        st.binary(max_size=512),
        st.sampled_from(valid).flatmap(lambda v: st.one_of(st.just(v), mutated(v))),
    )
