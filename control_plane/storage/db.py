"""Engines, sessions, schema migrations and the UTC timestamp type for the control plane's DB.

This is the SQLAlchemy adapter's plumbing only: no queries and no policy live here.
Nothing is created at import time; callers build an engine from settings in ``main()``.

SQLite notes (the embedded default):

* Every connection gets ``journal_mode=WAL``, ``foreign_keys=ON``, ``busy_timeout=5000``
  and ``synchronous=NORMAL``.
* The ``sqlite3`` driver's legacy transaction control is switched off and SQLAlchemy emits
  ``BEGIN`` itself, so that SELECTs are inside the transaction, DDL is transactional (a
  failed migration leaves nothing behind) and SAVEPOINT works. A transaction that must
  take the write lock up front (read-then-write) can ask for it per connection with
  ``connection.execution_options(sqlite_begin="IMMEDIATE")``; the default is ``DEFERRED``.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, DateTime, Dialect, Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.types import TypeDecorator, TypeEngine

from control_plane.errors import UnavailableError
from control_plane.fsutil import PRIVATE_FILE_MODE, make_private_dirs

__all__ = [
    "MIGRATIONS_DIR",
    "SchemaOutOfDateError",
    "UTCDateTime",
    "alembic_config",
    "check_schema_current",
    "create_engine_for",
    "current_revision",
    "downgrade",
    "head_revision",
    "migrate",
    "migration_connection",
    "session_factory",
]

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

SQLITE_BUSY_TIMEOUT_MS = 5000
_SQLITE_BEGIN_MODES = frozenset({"DEFERRED", "IMMEDIATE", "EXCLUSIVE"})
# Serialises migrate() across control-plane replicas starting at once (PostgreSQL only).
_PG_MIGRATION_LOCK_KEY = 0x6564_6765_666C_7431  # b"edgeflt1"; any constant bigint works


class SchemaOutOfDateError(UnavailableError):
    """The database schema is not at the revision this build expects; run the migrations."""

    title = "database schema out of date"


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware datetime, stored as UTC and always read back as aware UTC.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so it stores naive UTC.
    Naive datetimes are refused on write: a timestamp whose zone is a guess is a bug.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(DateTime(timezone=False))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"UTCDateTime expects a datetime, got {type(value).__name__}")
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} refused: pass an aware one")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


POSTGRESQL_POOL_SIZE = 16


def create_engine_for(url: str) -> Engine:
    """An engine for ``url`` (``sqlite:///…`` or ``postgresql+psycopg://…``), tuned per backend."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            _create_private_sqlite_file(Path(database).expanduser())
        engine = create_engine(parsed)
        _configure_sqlite(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        # Kept open: as many connections as threads that use them at once (the event
        # loop's worker threads, the record writer, the MQTT bridge's workers). A smaller
        # pool closes and reopens connections under load, and each reconnect costs
        # PostgreSQL a process.
        return create_engine(
            parsed, pool_pre_ping=True, pool_size=POSTGRESQL_POOL_SIZE, max_overflow=10
        )
    return create_engine(parsed)


def _create_private_sqlite_file(path: Path) -> None:
    """Create the database file 0600 before SQLite does (it would use 0644 & ~umask).

    SQLite gives `-wal` and `-shm` the mode of the database file, so they follow. A file
    left readable by everyone (an older release made it so) loses its world bits.
    """
    make_private_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        for existing in (
            path,
            path.with_name(path.name + "-wal"),
            path.with_name(path.name + "-shm"),
        ):
            with contextlib.suppress(FileNotFoundError):
                mode = stat.S_IMODE(existing.stat().st_mode)
                if mode & 0o007:
                    existing.chmod(mode & ~0o007)
        return
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Outside any transaction: journal_mode cannot change inside one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            _enable_wal(cursor)
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        options = connection.get_execution_options()
        if options.get("isolation_level") == "AUTOCOMMIT":
            return
        # SQLAlchemy's isolation-level reset (after an AUTOCOMMIT use of this pooled
        # connection) puts the driver back in legacy mode; take BEGIN over again.
        driver_connection = connection.connection.driver_connection
        if driver_connection is not None:
            driver_connection.isolation_level = None
        mode = str(options.get("sqlite_begin", "DEFERRED")).upper()
        if mode not in _SQLITE_BEGIN_MODES:
            raise ValueError(f"sqlite_begin must be one of {sorted(_SQLITE_BEGIN_MODES)}")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL (persistent, so usually already done).

    The switch needs an exclusive lock and SQLite reports "database is locked" at once,
    without its busy handler, when another connection is opening the same new file;
    so it is retried briefly here, up to the busy timeout.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.002
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
                return
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 0.1)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)


def alembic_config(url: str | None = None) -> Config:
    """Alembic configuration built in code, so migrations run from an installed package."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # ConfigParser interpolation: a literal '%' (e.g. in a password) must be doubled.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@contextmanager
def migration_connection(engine: Engine) -> Iterator[Connection]:
    """One connection and one transaction for a whole migration run.

    PostgreSQL: an advisory lock makes concurrent replicas take turns (the later one
    finds the schema at head and does nothing). SQLite: foreign keys are switched off
    for the run, as SQLite's table-rebuild procedure requires (a batch "move and copy"
    would otherwise cascade deletes), then ``PRAGMA foreign_key_check`` must pass before
    the commit.
    """
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            # The pragma is a no-op inside a transaction, so it goes straight to the driver
            # (which is in autocommit mode between our BEGINs).
            raw = connection.connection.driver_connection
            assert raw is not None
            raw.execute("PRAGMA foreign_keys=OFF")
            try:
                connection.execution_options(sqlite_begin="IMMEDIATE")
                with connection.begin():
                    yield connection
                    violations = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if violations:
                        raise RuntimeError(f"migration broke foreign keys: {violations[:5]}")
            finally:
                raw.execute("PRAGMA foreign_keys=ON")
        else:
            with connection.begin():
                if engine.dialect.name == "postgresql":
                    connection.exec_driver_sql(
                        f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK_KEY})"
                    )
                yield connection


def migrate(url_or_engine: str | Engine, revision: str = "head") -> None:
    """Upgrade the schema to ``revision`` (default: head). A no-op when already there."""
    engine, owned = _engine_of(url_or_engine)
    try:
        config = alembic_config()
        with migration_connection(engine) as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        if owned:
            engine.dispose()


def downgrade(url_or_engine: str | Engine, revision: str) -> None:
    """Downgrade the schema to ``revision`` (``"base"`` drops everything). For tests and ops."""
    engine, owned = _engine_of(url_or_engine)
    try:
        config = alembic_config()
        with migration_connection(engine) as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        if owned:
            engine.dispose()


def _engine_of(url_or_engine: str | Engine) -> tuple[Engine, bool]:
    if isinstance(url_or_engine, Engine):
        return url_or_engine, False
    return create_engine_for(url_or_engine), True


def head_revision() -> str:
    """The newest migration this build ships."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or ``None`` if it was never migrated."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def check_schema_current(engine: Engine) -> None:
    """Raise :class:`SchemaOutOfDateError` unless the database is exactly at head."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return
    if current is None:
        message = f"database has no schema; run the migrations (to revision {head})"
    elif _is_known_revision(current):
        message = f"database schema is at revision {current}, this build needs {head}"
    else:
        message = (
            f"database schema is at revision {current}, unknown to this build (a newer "
            f"release migrated it?); this build needs {head}"
        )
    raise SchemaOutOfDateError(message, current_revision=current, head_revision=head)


def _is_known_revision(revision: str) -> bool:
    script = ScriptDirectory.from_config(alembic_config())
    return any(rev.revision == revision for rev in script.walk_revisions())
