"""A mergeable latency sketch (DDSketch-style log buckets) and its JSON wire form.

What it is for: the edge node records every frame's latency into one of these per model
version and report window; the control plane merges windows into per-minute and per-hour
roll-ups and reads P50/P95/P99 back out. Both sides must agree on the bucket layout to the
bit, so the layout, its codec and the merge live here, beside the other wire contracts,
rather than in a copy per side (ADR 0017). Pure: ``math`` only, no I/O, no clock.

What it is not for: timing anything, or choosing units. A sketch holds plain numbers; the
key it is stored under says their unit (``compute_ms``: milliseconds).

The guarantee (``relative_accuracy`` alpha, default 1 %): a value ``x > MIN_VALUE`` goes
to bucket ``k = ceil(log(x) / log(gamma))`` with ``gamma = (1 + alpha) / (1 - alpha)``, so
``gamma**(k - 1) < x <= gamma**k``, and a bucket reads back as ``2 * gamma**k / (gamma + 1)``,
within alpha (relative) of anything in it. So ``quantile(q)`` is within alpha of the exact
``sorted(values)[floor(q * (n - 1))]``, clamped to the exact min and max, which are kept.
Values at or below ``MIN_VALUE`` (zero, negative, NaN) count in a zero bucket that reads
back as the minimum, an absolute error of at most ``MIN_VALUE``. A sketch keeps at most
``max_buckets`` buckets: past that the lowest ones are folded into the lowest kept one, so
high quantiles (the ones that matter for latency) keep the guarantee and only the lowest
ranks lose it. 512 buckets at 1 % hold values spanning a ratio of 25,000 (0.1 ms to
2.5 s) before any folding.

Wire form (``to_wire`` / ``from_wire``), version 1::

    {"v": 1, "alpha": 0.01, "n": 1200, "zeros": 0, "sum": 2.4e4, "min": 12.1, "max": 48.0,
     "bins": [k0, c0, d1, c1, d2, c2, ...]}

``bins`` lists the non-empty buckets in increasing key order as pairs: the first key
itself, then each key as its difference from the previous one (always > 0), each followed
by its count. ``n = zeros + sum(counts)``; ``min``/``max`` are ``null`` when ``n == 0``.
Unknown fields are ignored; a larger ``v`` is refused. Merging is exact on counts (sum of
bucket counts, min of mins, max of maxes), so it is associative and commutative, and merging
two windows equals recording both into one sketch (``sum`` up to float rounding).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeGuard

__all__ = [
    "DEFAULT_MAX_BUCKETS",
    "DEFAULT_RELATIVE_ACCURACY",
    "MAX_VALUE",
    "MAX_WIRE_BUCKETS",
    "MIN_VALUE",
    "WIRE_VERSION",
    "LatencySketch",
    "SketchError",
]

WIRE_VERSION: Final = 1
DEFAULT_RELATIVE_ACCURACY: Final = 0.01
DEFAULT_MAX_BUCKETS: Final = 512
MIN_VALUE: Final = 1e-6
"""At or below this a value counts as zero (in milliseconds: one nanosecond)."""
MAX_VALUE: Final = 1e9
"""Above this a value is recorded as this (in milliseconds: eleven days)."""
MAX_WIRE_BUCKETS: Final = 8192
"""``from_wire`` refuses more buckets than this: a bound on what a peer can make us parse."""


class SketchError(ValueError):
    """A sketch that cannot be built, decoded or merged as asked."""


class LatencySketch:
    """Log-bucket histogram with relative error ``relative_accuracy``; see the module doc.

    Not thread-safe: one writer at a time (the node folds frames into it under its lock).
    """

    __slots__ = (
        "_bucket_counts",
        "_gamma",
        "_inv_log_gamma",
        "count",
        "max",
        "max_buckets",
        "min",
        "relative_accuracy",
        "sum",
        "zero_count",
    )

    def __init__(
        self,
        relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> None:
        if not (isinstance(relative_accuracy, float) and 0.0 < relative_accuracy < 0.5):
            raise SketchError(f"relative_accuracy must be a float in (0, 0.5): {relative_accuracy}")
        if isinstance(max_buckets, bool) or not isinstance(max_buckets, int) or max_buckets < 2:
            raise SketchError(f"max_buckets must be an integer >= 2: {max_buckets}")
        self.relative_accuracy = relative_accuracy
        self.max_buckets = max_buckets
        self._gamma = (1.0 + relative_accuracy) / (1.0 - relative_accuracy)
        self._inv_log_gamma = 1.0 / math.log(self._gamma)
        self._bucket_counts: dict[int, int] = {}
        self.count = 0
        self.zero_count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    # -- recording -------------------------------------------------------------------

    def add(self, value: float) -> None:
        """Record one value (O(1); a new bucket past ``max_buckets`` folds the lowest)."""
        if value > MIN_VALUE:  # False for NaN too
            if value > MAX_VALUE:
                value = MAX_VALUE
            key = math.ceil(math.log(value) * self._inv_log_gamma)
            counts = self._bucket_counts
            try:
                counts[key] += 1
            except KeyError:
                counts[key] = 1
                if len(counts) > self.max_buckets:
                    self._collapse()
        else:
            value = 0.0
            self.zero_count += 1
        self.count += 1
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def merge(self, other: LatencySketch) -> None:
        """Add ``other``'s contents to this sketch (``other`` is unchanged)."""
        if other.relative_accuracy != self.relative_accuracy:
            raise SketchError(
                "cannot merge sketches of different relative accuracy: "
                f"{self.relative_accuracy} and {other.relative_accuracy}"
            )
        counts = self._bucket_counts
        for key, count in other._bucket_counts.items():
            counts[key] = counts.get(key, 0) + count
        if len(counts) > self.max_buckets:
            self._collapse()
        self.count += other.count
        self.zero_count += other.zero_count
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @classmethod
    def merged(
        cls,
        sketches: Iterable[LatencySketch],
        *,
        relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> LatencySketch:
        """A new sketch holding all of ``sketches`` (an empty one when there are none)."""
        total = cls(relative_accuracy, max_buckets)
        for sketch in sketches:
            total.merge(sketch)
        return total

    def copy(self) -> LatencySketch:
        twin = LatencySketch(self.relative_accuracy, self.max_buckets)
        twin.merge(self)
        return twin

    def _collapse(self) -> None:
        # Keep the highest max_buckets keys; the lowest kept one takes the mass below it.
        # The result depends only on the union of keys, so merging stays associative.
        keys = sorted(self._bucket_counts)
        excess = len(keys) - self.max_buckets
        counts = self._bucket_counts
        moved = sum(counts.pop(key) for key in keys[:excess])
        counts[keys[excess]] += moved

    # -- reading ---------------------------------------------------------------------

    def quantile(self, q: float) -> float | None:
        """The estimate of ``sorted(values)[floor(q * (n - 1))]``; ``None`` when empty."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: Sequence[float]) -> list[float | None]:
        """Several quantiles in one pass over the buckets; ``qs`` need not be sorted."""
        for q in qs:
            if not 0.0 <= q <= 1.0:
                raise SketchError(f"a quantile must be in [0, 1]: {q}")
        if self.count == 0:
            return [None for _ in qs]
        order = sorted(range(len(qs)), key=lambda i: qs[i])
        results: list[float | None] = [None] * len(qs)
        keys = sorted(self._bucket_counts)
        cumulative = self.zero_count
        position = 0  # into keys; buckets before it are counted in `cumulative`
        low, high = self.min, self.max
        factor = 2.0 / (self._gamma + 1.0)
        for i in order:
            rank = qs[i] * (self.count - 1)
            if rank < self.zero_count:
                results[i] = low  # the zero bucket: min is the closest value we know
                continue
            while cumulative <= rank and position < len(keys):
                cumulative += self._bucket_counts[keys[position]]
                position += 1
            key = keys[position - 1] if position else keys[0]
            estimate = factor * self._gamma**key
            results[i] = min(max(estimate, low), high)
        return results

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    @property
    def bucket_count(self) -> int:
        return len(self._bucket_counts)

    def buckets(self) -> dict[int, int]:
        """A copy of the non-empty buckets, key → count (the zero bucket apart)."""
        return dict(self._bucket_counts)

    def __eq__(self, other: object) -> bool:
        """Same accuracy, buckets, counts, min and max; ``sum`` within float rounding."""
        if not isinstance(other, LatencySketch):
            return NotImplemented
        return (
            self.relative_accuracy == other.relative_accuracy
            and self._bucket_counts == other._bucket_counts
            and self.count == other.count
            and self.zero_count == other.zero_count
            and self.min == other.min
            and self.max == other.max
            and math.isclose(self.sum, other.sum, rel_tol=1e-9, abs_tol=1e-9)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"<LatencySketch n={self.count} buckets={len(self._bucket_counts)} "
            f"alpha={self.relative_accuracy}>"
        )

    # -- wire ------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready form described in the module docstring."""
        bins: list[int] = []
        previous: int | None = None
        for key in sorted(self._bucket_counts):
            bins.append(key if previous is None else key - previous)
            bins.append(self._bucket_counts[key])
            previous = key
        empty = self.count == 0
        return {
            "v": WIRE_VERSION,
            "alpha": self.relative_accuracy,
            "n": self.count,
            "zeros": self.zero_count,
            "sum": self.sum,
            "min": None if empty else self.min,
            "max": None if empty else self.max,
            "bins": bins,
        }

    @classmethod
    def from_wire(
        cls, data: Mapping[str, Any], *, max_buckets: int = DEFAULT_MAX_BUCKETS
    ) -> LatencySketch:
        """Decode and check ``to_wire``'s form; raise ``SketchError`` on anything off."""
        version = data.get("v")
        if version != WIRE_VERSION:
            raise SketchError(f"unknown sketch wire version {version!r} (this code reads 1)")
        alpha = data.get("alpha")
        if isinstance(alpha, int) and not isinstance(alpha, bool):
            alpha = float(alpha)
        if not isinstance(alpha, float):
            raise SketchError(f"alpha must be a number: {alpha!r}")
        sketch = cls(alpha, max_buckets)
        count = _wire_int(data, "n")
        zeros = _wire_int(data, "zeros")
        bins = data.get("bins")
        if not isinstance(bins, list) or len(bins) % 2:
            raise SketchError("bins must be a list of (key delta, count) pairs")
        if len(bins) > 2 * MAX_WIRE_BUCKETS:
            raise SketchError(f"more than {MAX_WIRE_BUCKETS} buckets")
        counts: dict[int, int] = {}
        key = 0
        # Keys a recorded value can have (values are kept within MIN_VALUE..MAX_VALUE):
        # anything else would overflow gamma**key when read.
        lowest = math.ceil(math.log(MIN_VALUE) * sketch._inv_log_gamma) - 1
        highest = math.ceil(math.log(MAX_VALUE) * sketch._inv_log_gamma) + 1
        for index in range(0, len(bins), 2):
            step, bucket = bins[index], bins[index + 1]
            if not (_is_int(step) and _is_int(bucket)) or bucket <= 0:
                raise SketchError(f"bad bucket at pair {index // 2}: {step!r}, {bucket!r}")
            if index and step <= 0:
                raise SketchError(f"bucket keys must increase (pair {index // 2})")
            key = step if index == 0 else key + step
            if not lowest <= key <= highest:
                raise SketchError(f"bucket key {key} is outside [{lowest}, {highest}]")
            counts[key] = bucket
        if zeros + sum(counts.values()) != count:
            raise SketchError(f"n={count} is not zeros plus the bucket counts")
        total = data.get("sum")
        if not _is_number(total) or not math.isfinite(total) or total < 0:
            raise SketchError(f"sum must be a finite number >= 0: {total!r}")
        low, high = data.get("min"), data.get("max")
        if count == 0:
            if low is not None or high is not None:
                raise SketchError("an empty sketch has null min and max")
        elif _is_number(low) and _is_number(high) and 0 <= low <= high:
            sketch.min, sketch.max = float(low), float(high)
        else:
            raise SketchError(f"min and max must be numbers with 0 <= min <= max: {low}, {high}")
        sketch._bucket_counts = counts
        if len(counts) > max_buckets:
            sketch._collapse()
        sketch.count = count
        sketch.zero_count = zeros
        sketch.sum = float(total)
        return sketch


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _wire_int(data: Mapping[str, Any], name: str) -> int:
    value = data.get(name)
    if not _is_int(value) or value < 0:
        raise SketchError(f"{name} must be an integer >= 0: {value!r}")
    return value
