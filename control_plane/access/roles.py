"""Operator roles and API token rules: a pure core (no I/O, no framework).

Roles are ordered; a caller may do whatever a lower role may do. Tokens are
high-entropy random strings, so a plain SHA-256 is the right stored form (a slow
password hash buys nothing against 256 bits of entropy and costs every request).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from control_plane.errors import InvalidInputError, PermissionDeniedError

TOKEN_PREFIX = "eft_"


class Role(enum.IntEnum):
    """viewer < operator < release-manager < admin."""

    VIEWER = 10
    OPERATOR = 20
    RELEASE_MANAGER = 30
    ADMIN = 40

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, text: str) -> Role:
        for role in cls:
            if role.label == text.strip().lower():
                return role
        choices = ", ".join(r.label for r in cls)
        raise InvalidInputError(f"unknown role {text!r}; choose one of {choices}", role=text)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: resolved from a token by the API layer."""

    token_id: str
    name: str
    role: Role

    def require(self, needed: Role, action: str) -> None:
        if self.role < needed:
            raise PermissionDeniedError(
                f"{action} needs role {needed.label}; token {self.name!r} has {self.role.label}",
                needed=needed.label,
                actual=self.role.label,
            )


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_matches(token: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), stored_hash)
