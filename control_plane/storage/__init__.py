"""The control plane's relational storage: engines, sessions, migrations and ORM rows.

An adapter only: queries that carry policy belong to the services that use these rows.
"""

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
