"""The one duration parser the CLI and the API share (control_plane.durations)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.durations import UNITS, DurationError, format_duration, parse_duration

MAX_SECONDS = timedelta.max // timedelta(seconds=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3600", timedelta(hours=1)),
        ("0", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("6h", timedelta(hours=6)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        ("1h30m", timedelta(minutes=90)),
        ("1w2d3h4m5s", timedelta(weeks=1, days=2, hours=3, minutes=4, seconds=5)),
        (" 6H\n", timedelta(hours=6)),
        ("9999999999", timedelta(seconds=9_999_999_999)),
    ],
)
def test_seconds_and_unit_parts_parse(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "h",
        "6 hours",
        "1h 30m",
        "-1h",
        "+5",
        "1.5h",
        "1y",
        "6hx",
        "99999999999",  # 11 digits of bare seconds
        "1234567890m",  # 10 digits in one part
        "999999999w",  # fits the pattern, not a timedelta
        "١٢",  # Arabic-Indic digits: isdigit() says yes, we say no
    ],
)
def test_garbage_is_one_clear_error(text: str) -> None:
    with pytest.raises(DurationError) as caught:
        parse_duration(text)
    assert isinstance(caught.value, ValueError)
    assert caught.value.text == text
    assert f"{text!r} is not a duration" in str(caught.value)
    assert "3600" in str(caught.value) and "1h30m" in str(caught.value)


@given(st.integers(min_value=0, max_value=MAX_SECONDS))
def test_format_then_parse_is_the_identity(seconds: int) -> None:
    span = timedelta(seconds=seconds)
    text = format_duration(span)
    assert parse_duration(text) == span
    assert parse_duration(text.upper()) == span


@given(st.integers(min_value=0, max_value=9_999_999_999))
def test_bare_seconds_read_as_seconds(seconds: int) -> None:
    assert parse_duration(str(seconds)) == timedelta(seconds=seconds)


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(sorted(UNITS))), min_size=1))
def test_parts_add_up_in_any_order(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    assert parse_duration(text) == timedelta(seconds=sum(n * UNITS[u] for n, u in parts))


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=12))
def test_anything_else_parses_or_raises_duration_error(text: str) -> None:
    try:
        span = parse_duration(text)
    except DurationError:
        return
    assert span >= timedelta(0)


def test_format_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ValueError):
        format_duration(timedelta(seconds=-1))
    with pytest.raises(ValueError):
        format_duration(timedelta(milliseconds=1500))
    assert format_duration(timedelta(0)) == "0s"
    assert format_duration(timedelta(hours=25, seconds=1)) == "1d1h1s"


def test_the_parser_is_pure() -> None:
    code = "import json, sys, control_plane.durations; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.check_output([sys.executable, "-c", code], text=True))
    heavy = {"fastapi", "sqlalchemy", "pydantic", "typer", "httpx", "grpc", "paho"}
    assert not heavy & {name.split(".")[0] for name in loaded}
