"""Alembic environment for the control plane schema; configured in code by ``storage.db``.

``storage.db.migrate()`` passes an open connection (already inside the migration
transaction) in ``config.attributes["connection"]``. Without one, a URL is taken from
``-x url=…`` or the ``sqlalchemy.url`` option, e.g. for ``--sql`` offline scripts.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection

from control_plane.storage.db import UTCDateTime, create_engine_for, migration_connection
from control_plane.storage.models import Base

config = context.config
target_metadata = Base.metadata


def _render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    # Migrations must not import application types: they are frozen history, while
    # UTCDateTime may change. What it stores is a plain timestamp with time zone.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise RuntimeError("no database: pass -x url=… or use control_plane.storage.db.migrate()")
    return url


def _configure(connection: Connection) -> None:
    is_sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=is_sqlite,
        # storage.db takes over BEGIN on SQLite, which makes its DDL transactional.
        transactional_ddl=True,
        compare_type=True,
        render_item=_render_item,
    )


def run_migrations_offline() -> None:
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine_for(_url())
    try:
        with migration_connection(engine) as own_connection:
            _configure(own_connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
