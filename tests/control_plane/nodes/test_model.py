"""The node domain values: token states, the one refusal-reason rule and the agent checks
every transport shares."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from control_plane.errors import (
    AuthenticationError,
    InvalidInputError,
    PayloadTooLargeError,
    reason_of,
)
from control_plane.nodes.model import (
    BootstrapTokenInfo,
    NodeRefusals,
    checked_agent,
    human_duration,
)

# That the model imports no framework is checked with every pure core: tests/test_architecture.py.


def test_reasons_are_the_errors_own_else_its_class_in_kebab_case() -> None:
    assert reason_of(InvalidInputError("x", reason="bad-batch")) == "bad-batch"
    assert reason_of(InvalidInputError("x")) == "invalid-input"
    assert reason_of(PayloadTooLargeError("x")) == "payload-too-large"
    assert reason_of(AuthenticationError("x", reason="")) == "authentication"


def test_refusals_count_by_reason() -> None:
    refusals = NodeRefusals()
    refusals.refused("enroll", InvalidInputError("x", reason="token-used"))
    refusals.refused("authorize", AuthenticationError("x", reason="node-unknown"), node_id="n")
    refusals.refused("enroll", InvalidInputError("x", reason="token-used"))
    assert refusals.snapshot() == {"token-used": 2, "node-unknown": 1}
    assert refusals["token-used"] == 2 and refusals["other"] == 0


def test_agent_checks_treat_empty_as_unset_and_refuse_the_rest() -> None:
    assert checked_agent("", "") == (None, None)
    assert checked_agent("1.2.3", "mqtt") == ("1.2.3", "mqtt")
    for version, transport in (("x" * 65, None), ("a\nb", None), (None, "carrier-pigeon")):
        with pytest.raises(InvalidInputError) as info:
            checked_agent(version, transport)
        assert info.value.fields["reason"] == "bad-hello"


def test_token_states_and_durations() -> None:
    now = datetime(2026, 3, 1, tzinfo=UTC)
    token = BootstrapTokenInfo(
        id="t",
        fleet="gates",
        labels={},
        created_at=now,
        created_by="alice",
        expires_at=now + timedelta(hours=1),
        used_at=None,
        node_id=None,
        revoked_at=None,
    )
    assert token.state(now) == "active"
    assert token.state(now + timedelta(hours=1)) == "expired"
    assert [human_duration(timedelta(seconds=s)) for s in (60, 3600, 86400, 90)] == [
        "1m",
        "1h",
        "1d",
        "90s",
    ]
