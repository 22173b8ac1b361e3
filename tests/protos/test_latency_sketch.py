"""The latency sketch: its stated error against exact quantiles, merge laws, wire form."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protos.latency_sketch import MAX_WIRE_BUCKETS, MIN_VALUE, LatencySketch, SketchError

QUANTILES = (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)

Distribution = Callable[[random.Random], float]

# Latency-like shapes (milliseconds): light and heavy tails, several modes, a constant,
# values spanning six decades, and some zeros mixed in.
DISTRIBUTIONS: dict[str, Distribution] = {
    "lognormal": lambda r: r.lognormvariate(math.log(20.0), 0.4),
    "lognormal_wide": lambda r: r.lognormvariate(0.0, 2.5),
    "exponential": lambda r: r.expovariate(1 / 5.0),
    "uniform": lambda r: r.uniform(1.0, 100.0),
    "pareto_tail": lambda r: 2.0 * r.paretovariate(1.2),
    "bimodal": lambda r: r.gauss(8.0, 0.5) if r.random() < 0.8 else r.gauss(120.0, 10.0),
    "constant": lambda r: 33.3,
    "with_zeros": lambda r: 0.0 if r.random() < 0.05 else r.lognormvariate(1.0, 1.0),
    "six_decades": lambda r: 10 ** r.uniform(-2.0, 4.0),
}


def exact(values: list[float], q: float) -> float:
    ordered = sorted(max(v, 0.0) for v in values)
    return ordered[int(q * (len(ordered) - 1))]


def assert_within(estimate: float | None, truth: float, alpha: float) -> None:
    assert estimate is not None
    if truth <= MIN_VALUE:
        assert estimate <= MIN_VALUE
    else:
        assert abs(estimate - truth) <= alpha * truth * (1 + 1e-9), (estimate, truth)


@pytest.mark.parametrize("alpha", [0.01, 0.02, 0.05])
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_quantiles_are_within_the_stated_relative_error(name: str, alpha: float) -> None:
    for seed in range(5):
        rng = random.Random(f"{name}/{alpha}/{seed}")
        values = [DISTRIBUTIONS[name](rng) for _ in range(rng.choice([1, 7, 100, 2000, 20000]))]
        sketch = LatencySketch(alpha, max_buckets=4096)  # no folding: see the next tests
        for value in values:
            sketch.add(value)
        estimates = sketch.quantiles(QUANTILES)
        for q, estimate in zip(QUANTILES, estimates, strict=True):
            assert_within(estimate, exact(values, q), alpha)
            assert estimate == sketch.quantile(q)
        assert sketch.count == len(values)
        assert sketch.max == max(values)
        assert sketch.min == max(min(values), 0.0)
        assert sketch.sum == pytest.approx(sum(max(v, 0.0) for v in values))


def test_an_empty_sketch_has_no_quantile() -> None:
    sketch = LatencySketch()
    assert sketch.quantile(0.99) is None
    assert sketch.mean is None
    assert sketch.to_wire()["min"] is None


def test_zero_negative_and_nan_count_as_zero_and_infinity_is_capped() -> None:
    sketch = LatencySketch()
    for value in (0.0, -3.0, float("nan"), 1e-9, 5.0, float("inf")):
        sketch.add(value)
    assert sketch.count == 6
    assert sketch.zero_count == 4
    assert sketch.quantile(0.0) == 0.0
    assert sketch.max == 1e9
    assert math.isfinite(sketch.sum)


def test_past_max_buckets_the_low_end_folds_and_high_quantiles_keep_their_error() -> None:
    rng = random.Random(7)
    values = [10 ** rng.uniform(-3, 6) for _ in range(20000)]  # ~1,000 buckets at 1 %
    sketch = LatencySketch(0.01, max_buckets=128)
    for value in values:
        sketch.add(value)
    assert sketch.bucket_count == 128
    for q in (0.9, 0.95, 0.99, 0.999, 1.0):
        assert_within(sketch.quantile(q), exact(values, q), 0.01)
    assert sketch.count == len(values)


def split(values: list[float], rng: random.Random, parts: int) -> list[list[float]]:
    chunks: list[list[float]] = [[] for _ in range(parts)]
    for value in values:
        chunks[rng.randrange(parts)].append(value)
    return chunks


def sketch_of(values: list[float], max_buckets: int = 512) -> LatencySketch:
    sketch = LatencySketch(0.01, max_buckets)
    for value in values:
        sketch.add(value)
    return sketch


@pytest.mark.parametrize("max_buckets", [512, 24])
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_merge_is_associative_and_equals_recording_everything_into_one(
    name: str, max_buckets: int
) -> None:
    rng = random.Random(f"merge/{name}/{max_buckets}")
    values = [DISTRIBUTIONS[name](rng) for _ in range(3000)]
    a, b, c = (sketch_of(part, max_buckets) for part in split(values, rng, 3))
    left = a.copy()
    left.merge(b)
    left.merge(c)
    bc = b.copy()
    bc.merge(c)
    right = a.copy()
    right.merge(bc)
    swapped = LatencySketch.merged([c, a, b], max_buckets=max_buckets)
    whole = sketch_of(values, max_buckets)
    assert left == right == swapped == whole
    assert left.quantiles(QUANTILES) == whole.quantiles(QUANTILES)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(min_value=0.0, max_value=1e7, allow_nan=False), max_size=60),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([8, 512]),
)
def test_merge_of_any_split_equals_one_sketch(parts: list[list[float]], max_buckets: int) -> None:
    merged = LatencySketch.merged(
        (sketch_of(part, max_buckets) for part in parts), max_buckets=max_buckets
    )
    assert merged == sketch_of([v for part in parts for v in part], max_buckets)
    decoded = LatencySketch.from_wire(json.loads(json.dumps(merged.to_wire())))
    assert decoded == merged


def test_merge_refuses_another_accuracy() -> None:
    with pytest.raises(SketchError, match="relative accuracy"):
        LatencySketch(0.01).merge(LatencySketch(0.02))


def test_wire_form_round_trips_through_json_and_is_compact() -> None:
    rng = random.Random(3)
    sketch = sketch_of([rng.lognormvariate(math.log(25.0), 0.3) for _ in range(10000)])
    sketch.add(0.0)
    wire = sketch.to_wire()
    text = json.dumps(wire, separators=(",", ":"))
    assert len(text) < 1500  # ~100 buckets for a lognormal of sigma 0.3 at 1 %
    decoded = LatencySketch.from_wire(json.loads(text))
    assert decoded == sketch
    assert decoded.quantiles(QUANTILES) == sketch.quantiles(QUANTILES)
    # Keys are deltas after the first one, each followed by its count.
    keys = sorted(sketch.buckets())
    assert wire["bins"][0] == keys[0]
    assert wire["bins"][2] == keys[1] - keys[0]


def test_unknown_fields_are_ignored() -> None:
    wire = sketch_of([1.0, 2.0]).to_wire() | {"from_a_newer_node": True}
    assert LatencySketch.from_wire(wire).count == 2


GOOD = {"v": 1, "alpha": 0.01, "n": 3, "zeros": 1, "sum": 3.0, "min": 0.0, "max": 2.0}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"v": 2}, "wire version"),
        ({"alpha": "0.01"}, "alpha"),
        ({"alpha": 0.9}, "relative_accuracy"),
        ({"n": -1}, "n must be"),
        ({"n": 4}, "is not zeros plus"),
        ({"zeros": True}, "zeros must be"),
        ({"bins": [0, 1, 0, 1]}, "increase"),
        ({"bins": [0, 1, -3, 1]}, "increase"),
        ({"bins": [0, 0, 5, 2]}, "bad bucket"),
        ({"bins": [0, 1, 5]}, "pairs"),
        ({"bins": "0,1"}, "pairs"),
        ({"bins": [0, 1.5, 5, 1]}, "bad bucket"),
        ({"sum": float("inf")}, "sum"),
        ({"sum": None}, "sum"),
        ({"min": 3.0}, "min and max"),
        ({"max": None}, "min and max"),
        # A key no recorded value can have (gamma**key would overflow when read).
        ({"bins": [0, 1, 100_000, 1]}, "outside"),
        ({"bins": [-100_000, 1, 5, 1]}, "outside"),
    ],
)
def test_from_wire_refuses_malformed_sketches(change: dict[str, object], message: str) -> None:
    wire = {**GOOD, "bins": [0, 1, 35, 1]} | change
    with pytest.raises(SketchError, match=message):
        LatencySketch.from_wire(wire)


def test_from_wire_accepts_the_good_example_and_bounds_what_it_parses() -> None:
    assert LatencySketch.from_wire({**GOOD, "bins": [0, 1, 35, 1]}).count == 3
    too_many = [0, 1] + [1, 1] * MAX_WIRE_BUCKETS
    wire = {**GOOD, "n": MAX_WIRE_BUCKETS + 2, "bins": too_many}
    with pytest.raises(SketchError, match="more than"):
        LatencySketch.from_wire(wire)
    empty = {"v": 1, "alpha": 0.01, "n": 0, "zeros": 0, "sum": 0, "min": None, "max": None}
    assert LatencySketch.from_wire({**empty, "bins": []}).count == 0
    with pytest.raises(SketchError, match="null"):
        LatencySketch.from_wire({**empty, "bins": [], "min": 0.0})


def test_a_received_sketch_over_the_bucket_bound_is_folded() -> None:
    wide = sketch_of([10 ** (i / 50) for i in range(400)], max_buckets=4096)
    assert wide.bucket_count > 100
    narrow = LatencySketch.from_wire(wide.to_wire(), max_buckets=100)
    assert narrow.bucket_count == 100
    assert narrow.count == wide.count
    assert narrow.quantile(0.99) == wide.quantile(0.99)


@pytest.mark.parametrize("q", [-0.1, 1.5])
def test_quantile_outside_zero_one_is_refused(q: float) -> None:
    with pytest.raises(SketchError):
        sketch_of([1.0]).quantile(q)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(SketchError):
        LatencySketch(0.0)
    with pytest.raises(SketchError):
        LatencySketch(0.01, max_buckets=1)


def test_the_default_bound_covers_a_ratio_of_25000_without_folding() -> None:
    rng = random.Random(11)
    values = [0.1 * 10 ** rng.uniform(0.0, math.log10(25000.0)) for _ in range(20000)]
    sketch = sketch_of(values)  # defaults: 1 %, 512 buckets
    assert sketch.bucket_count <= 512
    for q in QUANTILES:
        assert_within(sketch.quantile(q), exact(values, q), 0.01)
