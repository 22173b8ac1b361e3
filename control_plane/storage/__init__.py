"""The control plane's relational storage: engines, sessions, migrations and ORM rows.

An adapter only: queries that carry policy belong to the services that use these rows.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from control_plane.storage.db import (
        SchemaOutOfDateError,
        UTCDateTime,
        check_schema_current,
        create_engine_for,
        current_revision,
        downgrade,
        head_revision,
        migrate,
        session_factory,
    )
    from control_plane.storage.models import (
        ApiTokenRow,
        ArtifactRow,
        AuditRow,
        Base,
        FleetRow,
        ModelFloorRow,
        ModelVersionRow,
        TufMetadataRow,
    )

__all__ = [
    "ApiTokenRow",
    "ArtifactRow",
    "AuditRow",
    "Base",
    "FleetRow",
    "ModelFloorRow",
    "ModelVersionRow",
    "SchemaOutOfDateError",
    "TufMetadataRow",
    "UTCDateTime",
    "check_schema_current",
    "create_engine_for",
    "current_revision",
    "downgrade",
    "head_revision",
    "migrate",
    "session_factory",
]

# Public name -> (module, attribute), loaded on first use (PEP 562)
# so that importing one submodule does not load every ORM row and alembic
# through this package.
_EXPORTS: dict[str, tuple[str, str]] = {
    "ApiTokenRow": ("control_plane.storage.models", "ApiTokenRow"),
    "ArtifactRow": ("control_plane.storage.models", "ArtifactRow"),
    "AuditRow": ("control_plane.storage.models", "AuditRow"),
    "Base": ("control_plane.storage.models", "Base"),
    "FleetRow": ("control_plane.storage.models", "FleetRow"),
    "ModelFloorRow": ("control_plane.storage.models", "ModelFloorRow"),
    "ModelVersionRow": ("control_plane.storage.models", "ModelVersionRow"),
    "SchemaOutOfDateError": ("control_plane.storage.db", "SchemaOutOfDateError"),
    "TufMetadataRow": ("control_plane.storage.models", "TufMetadataRow"),
    "UTCDateTime": ("control_plane.storage.db", "UTCDateTime"),
    "check_schema_current": ("control_plane.storage.db", "check_schema_current"),
    "create_engine_for": ("control_plane.storage.db", "create_engine_for"),
    "current_revision": ("control_plane.storage.db", "current_revision"),
    "downgrade": ("control_plane.storage.db", "downgrade"),
    "head_revision": ("control_plane.storage.db", "head_revision"),
    "migrate": ("control_plane.storage.db", "migrate"),
    "session_factory": ("control_plane.storage.db", "session_factory"),
}


def __getattr__(name: str) -> object:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
