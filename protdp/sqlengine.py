"""SQLAlchemy engines for protdp's shared databases (the review queue, `protdp.review.db`, and
the leased work queue, `protdp.workqueue.engine`): one definition of how a SQLite file or a
PostgreSQL server is opened so that several processes can share it with bounded lock waits.

- SQLite: WAL (readers never block the writer; switching retried while another process opens
  the same new file), `busy_timeout` so a writer waits for the lock instead of failing at once,
  `synchronous=NORMAL`, and `BEGIN IMMEDIATE` for every transaction that is not marked
  read-only through the caller's execution option, so a read-then-write (a claim, a lease)
  holds the write lock from its first read.
- PostgreSQL: psycopg2 where psycopg 3 is missing, `pool_pre_ping`, and `lock_timeout` set on
  every new connection.
- Time is the database's (`NOW_SQL`), never a client's.

Each caller keeps its own error classes, messages and extra settings and passes them in.
"""

from __future__ import annotations

import importlib.util
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Sequence

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from protdp.errors import InputError

WAL_MIN_RETRY_S = 5.0     # the WAL switch is retried at least this long, whatever busy_timeout
NOW_SQL = {"sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
           "postgresql": "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8"}


def normalize_url(url: str) -> str:
    """A URL passes through; a bare path means a SQLite file there."""
    if "://" in url:
        return url
    return f"sqlite:///{Path(url).expanduser().resolve()}"


def parse_url(url: str, field: str) -> tuple[URL, str, str]:
    """(parsed URL, backend name, URL safe to show: no password) of a normalized `url`; a URL
    SQLAlchemy cannot read is an `InputError` on `field`."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InputError(f"not a database URL: {exc}", field=field) from None
    return parsed, parsed.get_backend_name(), parsed.render_as_string(hide_password=True)


def enable_wal(cursor, busy_s: float) -> None:
    """Put the SQLite file in WAL mode (persistent, so only the first opener changes it).

    Switching the journal mode needs an exclusive lock and SQLite answers "database is locked"
    at once, without its busy handler, when another process is opening the same new file (two
    ranks at start-up): retry until `busy_s` has passed.
    """
    deadline = time.monotonic() + busy_s
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05 + 0.1 * secrets.randbelow(100) / 100)


def sqlite_engine(parsed: URL, busy_s: float, *, readonly_option: str,
                  pragmas: Sequence[str] = ()) -> Engine:
    """Engine on the SQLite file of `parsed` (the caller has checked the path): WAL,
    busy_timeout `busy_s`, synchronous=NORMAL, then `pragmas` (e.g. "foreign_keys=ON") on
    every new connection; BEGIN IMMEDIATE unless the connection's execution option
    `readonly_option` is true."""
    engine = create_engine(parsed, connect_args={"timeout": busy_s, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None     # we issue BEGIN ourselves (SQLAlchemy recipe)
        cur = dbapi_conn.cursor()
        enable_wal(cur, max(busy_s, WAL_MIN_RETRY_S))
        cur.execute(f"PRAGMA busy_timeout = {int(busy_s * 1000)}")
        cur.execute("PRAGMA synchronous=NORMAL")
        for pragma in pragmas:
            cur.execute(f"PRAGMA {pragma}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        readonly = conn.get_execution_options().get(readonly_option, False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def postgres_engine(parsed: URL, lock_timeout_s: float, *, safe_url: str,
                    error: type[Exception], settings: Sequence[str] = ()) -> Engine:
    """Engine on the PostgreSQL server of `parsed`: `lock_timeout` of `lock_timeout_s`, then
    the `settings` statements (e.g. "SET statement_timeout = 30000") on every new connection.
    A missing driver raises `error` naming `safe_url` and the extra to install."""
    if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None:
        # SQLAlchemy 2.1 defaults to psycopg 3; protdp[postgres] installs psycopg2.
        parsed = parsed.set(drivername="postgresql+psycopg2")
    try:
        engine = create_engine(parsed, pool_pre_ping=True)
    except NoSuchModuleError as exc:
        raise error(f"{safe_url}: {exc} (pip install 'protdp[postgres]')") from None
    lock_ms = max(1, int(lock_timeout_s * 1000))

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):
        cur = dbapi_conn.cursor()
        cur.execute(f"SET lock_timeout = {lock_ms}")
        for statement in settings:
            cur.execute(statement)
        cur.close()
        dbapi_conn.commit()

    return engine


def database_now(conn: Connection, dialect: str) -> float:
    """The database server's clock, epoch seconds."""
    return float(conn.exec_driver_sql(NOW_SQL[dialect]).scalar())
