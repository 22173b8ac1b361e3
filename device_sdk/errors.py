"""The SDK's errors, one root, split by whose fault it is.

DeviceSdkError
├── InvalidMessageError      the firmware passed something the contract cannot carry
└── BrokerError              the broker: ...
    ├── BrokerUnavailableError   ... cannot be reached, or went away
    └── BrokerRefusedError       ... answered and said no (CONNACK reason)
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "BrokerRefusedError",
    "BrokerUnavailableError",
    "ClientClosedError",
    "DeviceSdkError",
    "InvalidMessageError",
]


class DeviceSdkError(Exception):
    """Root of every error the SDK raises."""


class InvalidMessageError(DeviceSdkError, ValueError):
    """A result, frame or setting the device contract cannot carry (the caller's bug)."""


class ClientClosedError(DeviceSdkError):
    """The client was closed; nothing more can be buffered through it."""


class BrokerError(DeviceSdkError):
    pass


class BrokerUnavailableError(BrokerError):
    """No connection (refused TCP, DNS, TLS, timeout) or the connection was lost."""


class BrokerRefusedError(BrokerError):
    """The broker refused the CONNECT: `reason` is its CONNACK reason (credentials, ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the broker refused the connection: {reason}")
        self.reason = reason
