"""Whether the served online metadata is fresh enough to call this replica ready.

Pure: takes the served expiries and `now`, returns the reasons (none: fresh). Not the
re-signing itself (`RegistryService.refresh_expiring`): this is what shows that it stalled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

# The roles the control plane re-signs on a schedule; root and targets are the key
# holders' duty (the CLI warns before they lapse), so they never make a replica unready.
ONLINE_ROLES = ("snapshot", "timestamp")


@dataclass(frozen=True, slots=True)
class MetadataExpiry:
    """The newest served version of one role of one active fleet, and when it expires."""

    fleet: str
    role: str
    version: int
    expires_at: datetime


def stale_online_metadata(
    served: Iterable[MetadataExpiry], now: datetime, margins: Mapping[str, timedelta]
) -> list[str]:
    """One reason per online role that has expired or expires within its margin."""
    reasons: list[str] = []
    for md in sorted(served, key=lambda m: (m.fleet, m.role)):
        margin = margins.get(md.role)
        if md.role not in ONLINE_ROLES or margin is None:
            continue
        left = md.expires_at - now
        if left <= timedelta(0):
            reasons.append(
                f"fleet {md.fleet}: {md.role} v{md.version} expired at {md.expires_at.isoformat()}"
            )
        elif left <= margin:
            reasons.append(
                f"fleet {md.fleet}: {md.role} v{md.version} expires at "
                f"{md.expires_at.isoformat()}, within {_short(margin)}"
            )
    return reasons


def _short(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"
