"""Plane geometry of the rules, in normalised frame coordinates (x right, y down).

Anchor points of a box (where an object "is": bottom-centre by default, its feet, as
DeepStream and Frigate use), point-in-polygon, and the signed distance to a line. Plain
floats, no numpy: a rule asks about one point at a time, and a call into numpy would
cost more than the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, Literal

from edge_node.aggregation.model import Box

__all__ = [
    "ANCHORS",
    "Anchor",
    "Point",
    "Polygon",
    "anchor_point",
    "point_in_polygon",
    "segments_cross",
    "signed_distance",
]

Point = tuple[float, float]
Polygon = tuple[Point, ...]
Anchor = Literal[
    "bottom_centre", "centre", "top_centre", "bottom_left", "bottom_right", "top_left", "top_right"
]
ANCHORS: Final[tuple[Anchor, ...]] = (
    "bottom_centre",
    "centre",
    "top_centre",
    "bottom_left",
    "bottom_right",
    "top_left",
    "top_right",
)


def anchor_point(box: Box, anchor: Anchor) -> Point:
    if anchor == "bottom_centre":
        return ((box.x1 + box.x2) * 0.5, box.y2)
    if anchor == "centre":
        return ((box.x1 + box.x2) * 0.5, (box.y1 + box.y2) * 0.5)
    if anchor == "top_centre":
        return ((box.x1 + box.x2) * 0.5, box.y1)
    if anchor == "bottom_left":
        return (box.x1, box.y2)
    if anchor == "bottom_right":
        return (box.x2, box.y2)
    if anchor == "top_left":
        return (box.x1, box.y1)
    return (box.x2, box.y1)


def point_in_polygon(x: float, y: float, polygon: Sequence[Point]) -> bool:
    """Even-odd ray casting; a point on an edge may land either side (measure zero)."""
    inside = False
    n = len(polygon)
    px, py = polygon[n - 1]
    for i in range(n):
        qx, qy = polygon[i]
        if (qy > y) != (py > y) and x < (px - qx) * (y - qy) / (py - qy) + qx:
            inside = not inside
        px, py = qx, qy
    return inside


def signed_distance(x: float, y: float, a: Point, b: Point) -> float:
    """Distance of (x, y) from the line through a and b, positive on the right-hand side
    of a walker going from a to b on the picture (y grows downwards)."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    length = math.hypot(dx, dy)
    return (dx * (y - a[1]) - dy * (x - a[0])) / length


def segments_cross(p: Point, q: Point, a: Point, b: Point) -> bool:
    """Whether segment p-q meets segment a-b (touching counts)."""

    def orient(u: Point, v: Point, w: Point) -> float:
        return (v[0] - u[0]) * (w[1] - u[1]) - (v[1] - u[1]) * (w[0] - u[0])

    d1, d2 = orient(a, b, p), orient(a, b, q)
    d3, d4 = orient(p, q, a), orient(p, q, b)
    return (d1 * d2 <= 0.0) and (d3 * d4 <= 0.0)
