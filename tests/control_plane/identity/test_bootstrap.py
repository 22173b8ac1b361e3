"""Bootstrap tokens, node ids, labels and selectors: the pure rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from control_plane.errors import AuthenticationError, InvalidInputError
from control_plane.identity.bootstrap import (
    BOOTSTRAP_TOKEN_PREFIX,
    BootstrapTokenError,
    BootstrapTokenState,
    LabelSelector,
    check_bootstrap_token,
    hash_bootstrap_token,
    is_node_id,
    looks_like_bootstrap_token,
    new_bootstrap_token,
    new_node_id,
    parse_label_changes,
    parse_labels,
    parse_selector,
    validate_labels,
)

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def state(**kwargs: datetime | None) -> BootstrapTokenState:
    fields: dict[str, datetime | None] = {"expires_at": NOW + timedelta(hours=1)}
    fields.update(kwargs)
    return BootstrapTokenState(id="t1", **fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------ tokens


def test_tokens_are_random_prefixed_and_hashed() -> None:
    first, second = new_bootstrap_token(), new_bootstrap_token()
    assert first != second
    assert first.startswith(BOOTSTRAP_TOKEN_PREFIX)
    assert looks_like_bootstrap_token(first)
    assert len(hash_bootstrap_token(first)) == 64
    assert hash_bootstrap_token(first) != hash_bootstrap_token(second)


@pytest.mark.parametrize("token", ["", "efb_", "eft_abcdef", "x" * 10, "efb_" + "a" * 200])
def test_malformed_tokens_are_recognised_before_lookup(token: str) -> None:
    assert not looks_like_bootstrap_token(token)


def test_a_fresh_token_passes() -> None:
    check_bootstrap_token(state(), NOW)


@pytest.mark.parametrize(
    ("fields", "now", "reason"),
    [
        ({}, NOW + timedelta(hours=1), "token-expired"),
        ({"used_at": NOW}, NOW, "token-used"),
        ({"revoked_at": NOW}, NOW, "token-revoked"),
        ({"revoked_at": NOW, "used_at": NOW}, NOW + timedelta(days=1), "token-revoked"),
        ({"used_at": NOW}, NOW + timedelta(days=1), "token-used"),
    ],
)
def test_unusable_tokens_are_refused_with_the_reason(
    fields: dict[str, datetime], now: datetime, reason: str
) -> None:
    with pytest.raises(BootstrapTokenError) as info:
        check_bootstrap_token(state(**fields), now)
    assert info.value.reason == reason
    assert info.value.fields["reason"] == reason
    assert isinstance(info.value, AuthenticationError)


def test_node_ids() -> None:
    ids = {new_node_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(is_node_id(i) and len(i) == 14 for i in ids)
    assert not is_node_id("n-XYZ")


# ------------------------------------------------------------------ labels


def test_labels_parse() -> None:
    assert parse_labels("site=a,role=gate") == {"site": "a", "role": "gate"}
    assert parse_labels(" site = a , zone=B_1.x-2 ") == {"site": "a", "zone": "B_1.x-2"}
    assert parse_labels("") == {}


@pytest.mark.parametrize(
    "text",
    [
        "site",
        "site=",
        "=a",
        "site=a,site=b",
        "site=a,,role=b",
        "si te=a",
        "site=a/b",
        "k=" + "v" * 64,
    ],
)
def test_bad_labels_are_refused(text: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_labels(text)


def test_at_most_32_labels() -> None:
    validate_labels({f"k{i}": "v" for i in range(32)})
    with pytest.raises(InvalidInputError, match="at most 32"):
        parse_labels(",".join(f"k{i}=v" for i in range(33)))


def test_label_changes_set_and_remove() -> None:
    assert parse_label_changes("site=b,old-") == {"site": "b", "old": None}
    with pytest.raises(InvalidInputError):
        parse_label_changes("site")
    with pytest.raises(InvalidInputError):
        parse_label_changes("site=a,site-")


# --------------------------------------------------------------- selectors

LABELS = {"site": "a", "role": "gate", "gpu": "yes"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", True),
        ("site=a", True),
        ("site==a", True),
        ("site=b", False),
        ("site=a,role=gate", True),
        ("site=a,role=door", False),
        ("role!=gate", False),
        ("role!=door", True),
        ("zone!=x", True),  # Kubernetes: != also matches nodes without the key
        ("gpu", True),
        ("zone", False),
        ("!zone", True),
        ("!gpu", False),
        ("site=a, gpu, !legacy, role!=door", True),
    ],
)
def test_selectors_match_like_kubernetes(selector: str, expected: bool) -> None:
    assert parse_selector(selector).matches(LABELS) is expected


def test_the_empty_selector_matches_nodes_without_labels() -> None:
    assert LabelSelector().matches({})
    assert parse_selector("!site").matches({})


def test_selectors_print_canonically() -> None:
    assert str(parse_selector("site==a, role!=gate,gpu,!legacy")) == "site=a,role!=gate,gpu,!legacy"


@pytest.mark.parametrize("text", ["site=", "=a", "!", "si te", "a=b,,c", "site=a/b"])
def test_bad_selectors_are_refused(text: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_selector(text)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [("site in (a|b)", True), ("site in (b|c)", False), ("zone in (x)", False)],
)
def test_in_selectors_match_one_of_their_values(selector: str, expected: bool) -> None:
    assert parse_selector(selector).matches(LABELS) is expected


def test_in_selectors_print_sorted() -> None:
    assert str(parse_selector("site in ( b | a ),gpu")) == "site in (a|b),gpu"
    assert parse_selector(str(parse_selector("site in (b|a)"))) == parse_selector("site in (a|b)")


@pytest.mark.parametrize("text", ["site in ()", "site in (a|)", "site in a|b", "in (a)"])
def test_bad_in_selectors_are_refused(text: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_selector(text)


@pytest.mark.parametrize(
    ("one", "other", "expected"),
    [
        ("site=a", "site=b", False),
        ("site=a", "hw=x", True),  # a node with site=a and hw=x may enroll
        ("site=a", "site!=a", False),
        ("site=a", "!site", False),
        ("site!=a", "!site", True),
        ("site in (a|b)", "site in (b|c)", True),
        ("site in (a|b)", "site=c", False),
        ("site in (a|b)", "site!=a,site!=b", False),
        ("site", "!site", False),
        ("", "site=a", True),
    ],
)
def test_selectors_overlap_when_one_label_map_can_match_both(
    one: str, other: str, expected: bool
) -> None:
    assert parse_selector(one).may_overlap(parse_selector(other)) is expected
    assert parse_selector(other).may_overlap(parse_selector(one)) is expected
