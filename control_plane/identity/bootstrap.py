"""Bootstrap tokens, node ids, labels and label selectors: a pure core (no I/O).

A bootstrap token lets one node enroll once, into one fleet, before it expires. Like
API tokens it is a high-entropy random string, so its plain SHA-256 is the stored
form (`access.roles.hash_token`). Labels and selectors follow a small subset of
Kubernetes' rules: `site=a,role=gate` and `site=a,role!=gate,gpu,!legacy`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from control_plane.access.roles import hash_token
from control_plane.errors import AuthenticationError, InvalidInputError

__all__ = [
    "BOOTSTRAP_TOKEN_PREFIX",
    "MAX_LABELS",
    "BootstrapTokenError",
    "BootstrapTokenState",
    "LabelSelector",
    "Requirement",
    "check_bootstrap_token",
    "hash_bootstrap_token",
    "is_node_id",
    "looks_like_bootstrap_token",
    "new_bootstrap_token",
    "new_node_id",
    "parse_label_changes",
    "parse_labels",
    "parse_selector",
    "validate_labels",
]

BOOTSTRAP_TOKEN_PREFIX: Final = "efb_"
_MAX_TOKEN_CHARS: Final = 128
MAX_LABELS: Final = 32
MAX_SELECTOR_TERMS: Final = 32
_LABEL_PART = re.compile(r"[A-Za-z0-9._-]{1,63}")
_NODE_ID = re.compile(r"n-[0-9a-f]{12}")


class BootstrapTokenError(AuthenticationError):
    """A bootstrap token that does not (or no longer) allow an enrollment.

    `reason` is one of token-malformed, token-unknown, token-expired, token-used,
    token-revoked: what the refusal counter and the log record.
    """

    title = "bootstrap token refused"

    def __init__(self, message: str, *, reason: str, **fields: object) -> None:
        super().__init__(message, reason=reason, **fields)
        self.reason = reason


# ------------------------------------------------------------------- tokens


def new_bootstrap_token() -> str:
    return BOOTSTRAP_TOKEN_PREFIX + secrets.token_urlsafe(32)


def looks_like_bootstrap_token(token: str) -> bool:
    """A cheap shape check before any hashing or lookup of untrusted input."""
    return (
        isinstance(token, str)
        and token.startswith(BOOTSTRAP_TOKEN_PREFIX)
        and len(BOOTSTRAP_TOKEN_PREFIX) < len(token) <= _MAX_TOKEN_CHARS
    )


def hash_bootstrap_token(token: str) -> str:
    return hash_token(token)


@dataclass(frozen=True, slots=True)
class BootstrapTokenState:
    """What the single-use check needs of a stored token."""

    id: str
    expires_at: datetime
    used_at: datetime | None = None
    revoked_at: datetime | None = None


def check_bootstrap_token(token: BootstrapTokenState, now: datetime) -> None:
    """Raise BootstrapTokenError unless the token may enroll a node at `now`.

    Revoked before used before expired: the most deliberate reason is reported.
    """
    if token.revoked_at is not None:
        raise BootstrapTokenError(
            "this bootstrap token was revoked; ask an operator for a new one",
            reason="token-revoked",
            token_id=token.id,
        )
    if token.used_at is not None:
        raise BootstrapTokenError(
            "this bootstrap token was already used; each token enrolls one node",
            reason="token-used",
            token_id=token.id,
        )
    if now >= token.expires_at:
        raise BootstrapTokenError(
            f"this bootstrap token expired at {token.expires_at.isoformat()}",
            reason="token-expired",
            token_id=token.id,
        )


# ----------------------------------------------------------------- node ids


def new_node_id() -> str:
    """`n-` and 12 hex digits, chosen by the control plane, never by the node."""
    return "n-" + secrets.token_hex(6)


def is_node_id(text: str) -> bool:
    return isinstance(text, str) and _NODE_ID.fullmatch(text) is not None


# ------------------------------------------------------------------- labels


def _check_part(kind: str, text: str) -> str:
    if not isinstance(text, str) or not _LABEL_PART.fullmatch(text):
        raise InvalidInputError(
            f"label {kind} {text!r} must be 1-63 characters of letters, digits, '.', '_' or '-'",
            label=str(text)[:80],
        )
    return text


def validate_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Checked copy of a label map (at most 32 labels)."""
    if not isinstance(labels, Mapping):
        raise InvalidInputError("labels must be a map of strings")
    if len(labels) > MAX_LABELS:
        raise InvalidInputError(f"at most {MAX_LABELS} labels per node", count=len(labels))
    return {_check_part("key", k): _check_part("value", v) for k, v in labels.items()}


def _terms(text: str) -> list[str]:
    terms = [t.strip() for t in text.split(",")] if text.strip() else []
    if any(not t for t in terms):
        raise InvalidInputError(f"empty term in {text[:200]!r}")
    return terms


def parse_labels(text: str) -> dict[str, str]:
    """`site=a,role=gate` → {"site": "a", "role": "gate"}; "" → {}."""
    labels: dict[str, str] = {}
    for term in _terms(text):
        key, eq, value = term.partition("=")
        if not eq:
            raise InvalidInputError(f"label {term!r} is not key=value", label=term[:80])
        key, value = key.strip(), value.strip()
        if key in labels:
            raise InvalidInputError(f"label {key!r} given twice", label=key[:80])
        labels[key] = value
    return validate_labels(labels)


def parse_label_changes(text: str) -> dict[str, str | None]:
    """`site=b,old-` → {"site": "b", "old": None}: set some labels, remove others."""
    changes: dict[str, str | None] = {}
    for term in _terms(text):
        key, eq, value = term.partition("=")
        key = key.strip()
        if not eq and key.endswith("-"):
            key, new = key[:-1], None
        elif eq:
            new = _check_part("value", value.strip())
        else:
            raise InvalidInputError(
                f"label change {term!r} is neither key=value nor key- (remove)", label=term[:80]
            )
        if key in changes:
            raise InvalidInputError(f"label {key!r} given twice", label=key[:80])
        changes[_check_part("key", key)] = new
    if len(changes) > MAX_LABELS:
        raise InvalidInputError(f"at most {MAX_LABELS} labels per node", count=len(changes))
    return changes


# ---------------------------------------------------------------- selectors

Operator = Literal["=", "!=", "in", "exists", "!exists"]
_IN_TERM = re.compile(r"(?P<key>[^\s()|]+)\s+in\s*\((?P<values>[^()]*)\)")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: Operator
    value: str | None = None
    values: tuple[str, ...] = ()
    """The choices of `in` (sorted, distinct)."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "=":
            return labels.get(self.key) == self.value
        if self.op == "in":
            return labels.get(self.key) in self.values
        # As in Kubernetes, `key!=v` also matches nodes without the key.
        return labels.get(self.key) != self.value

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!exists":
            return f"!{self.key}"
        if self.op == "in":
            return f"{self.key} in ({'|'.join(self.values)})"
        return f"{self.key}{self.op}{self.value}"


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """All requirements must hold; the empty selector matches every node."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def may_overlap(self, other: LabelSelector) -> bool:
        """Whether some label map (a node enrolling tomorrow) matches both selectors."""
        keys = {r.key for r in self.requirements + other.requirements}
        return all(_satisfiable(self.requirements + other.requirements, key) for key in keys)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def _satisfiable(requirements: tuple[Requirement, ...], key: str) -> bool:
    """Whether one value (or the key's absence) meets every requirement on `key`."""
    own = [r for r in requirements if r.key == key]
    allowed: set[str] | None = None  # None: any value
    for r in own:
        if r.op in ("=", "in"):
            choices = {r.value} if r.op == "=" and r.value is not None else set(r.values)
            allowed = choices if allowed is None else allowed & choices
    excluded = {r.value for r in own if r.op == "!="}
    if any(r.op == "!exists" for r in own):  # absent: `!=` holds, `=`, `in`, `exists` fail
        return allowed is None and not any(r.op == "exists" for r in own)
    return allowed is None or bool(allowed - excluded)


def parse_selector(text: str) -> LabelSelector:
    """`site=a,role!=gate,gpu,!legacy,hw in (x|y)` (also `key==v`) → a LabelSelector."""
    requirements: list[Requirement] = []
    for term in _terms(text):
        in_term = _IN_TERM.fullmatch(term)
        if in_term is not None:
            parts = in_term["values"].split("|")
            if len(parts) > MAX_SELECTOR_TERMS:
                raise InvalidInputError(
                    f"at most {MAX_SELECTOR_TERMS} values in one `in` term", count=len(parts)
                )
            values = tuple(sorted({_value(v) for v in parts}))
            req = Requirement(_check_part("key", in_term["key"]), "in", values=values)
        elif "!=" in term:
            key, _, value = term.partition("!=")
            req = Requirement(_check_part("key", key.strip()), "!=", _value(value))
        elif "=" in term:
            key, _, value = term.partition("==") if "==" in term else term.partition("=")
            req = Requirement(_check_part("key", key.strip()), "=", _value(value))
        elif term.startswith("!"):
            req = Requirement(_check_part("key", term[1:].strip()), "!exists")
        else:
            req = Requirement(_check_part("key", term), "exists")
        requirements.append(req)
    if len(requirements) > MAX_SELECTOR_TERMS:
        raise InvalidInputError(
            f"at most {MAX_SELECTOR_TERMS} selector terms", count=len(requirements)
        )
    return LabelSelector(tuple(requirements))


def _value(text: str) -> str:
    return _check_part("value", text.strip())
