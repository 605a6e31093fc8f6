"""The queue database: engines, transactions, the database clock, bounded lock waits.

Time comes from the database in one place, `Database.now` (PostgreSQL's `clock_timestamp()`,
SQLite's `julianday('now')`), never from a client's clock: leases, session expiry and event
times all use it, so a reviewer whose machine runs an hour ahead cannot take a live lease.

Write transactions are `BEGIN IMMEDIATE` on SQLite (one writer at a time, WAL so readers never
block); a writer that holds the lock longer than `busy_timeout_s` makes others fail with
`QueueBusy` (a clear message, HTTP 503 in the web UI) instead of hanging. On PostgreSQL the
same bound is the session's `lock_timeout`, and `statement_timeout` and
`idle_in_transaction_session_timeout` end a stalled client's statement or open transaction, so
one hung reviewer cannot hold row or chain locks that block everybody else's writes.

`key` is the queue's audit key (`protdp.review.keys`), None where this process cannot read it;
every transaction carries it as `conn.info["review_key"]`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, event, inspect, select, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from protdp.errors import InputError
from protdp.review import keys
from protdp.review.errors import QueueBusy, QueueError
from protdp.review.schema import (APPEND_ONLY_DDL, DEFAULT_LIMITS, INSERT_GUARD_DDL,
                                  SCHEMA_VERSION, metadata, review_meta)

DEFAULT_QUEUE_URL = "sqlite:///review_queue.sqlite"
DEFAULT_BUSY_TIMEOUT_S = 10.0       # interactive: reviewers get a clear "busy" after this
BATCH_BUSY_TIMEOUT_S = 60.0         # the predictor enqueues in a batch and may wait longer
CHAIN_LOCK_KEY = 7310567             # pg_advisory_xact_lock key serialising audit appends
_SCHEMA_LOCK_KEY = 7310566
STATEMENT_TIMEOUT_S = 30.0          # PostgreSQL: one statement at most (verify/export included)
IDLE_IN_TRANSACTION_S = 60.0        # PostgreSQL: a client stalled inside a transaction
_NOW_SQL = {"sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
            "postgresql": "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8"}


def normalize_url(url: str) -> str:
    """A URL passes through; a bare path means a SQLite file there."""
    if "://" in url:
        return url
    return f"sqlite:///{Path(url).expanduser().resolve()}"


def _enable_wal(cursor, busy_s: float) -> None:
    """Put the SQLite file in WAL mode (persistent, so only the first opener changes it).

    Switching the journal mode needs an exclusive lock and SQLite answers "database is locked"
    at once, without its busy handler, when another process is opening the same new file (two
    prediction ranks at start-up): retry until `busy_s` has passed.
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


def _is_lock_timeout(exc: DBAPIError) -> bool:
    msg = str(exc.orig).lower()
    return "database is locked" in msg or "lock timeout" in msg \
        or getattr(exc.orig, "pgcode", None) == "55P03"


class Database:
    """Engine and transactions for the queue at `url` (SQLite path/URL or postgresql://)."""

    def __init__(self, url: str = DEFAULT_QUEUE_URL, *,
                 busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, create: bool = True):
        self.url = normalize_url(url)
        self.create = create
        self.busy_timeout_s = float(busy_timeout_s)
        try:
            parsed = make_url(self.url)
        except ArgumentError as exc:
            raise InputError(f"not a database URL: {exc}", field="queue-url") from None
        self.dialect = parsed.get_backend_name()
        self.safe_url = parsed.render_as_string(hide_password=True)
        self.key_path = keys.default_key_path(parsed)
        self.key = keys.read_key(self.key_path)
        if self.dialect == "sqlite":
            self.engine = self._sqlite_engine(parsed)
        elif self.dialect == "postgresql":
            self.engine = self._pg_engine(parsed)
        else:
            raise InputError(f"unsupported queue database '{self.dialect}' in {self.safe_url}; "
                             "use a SQLite path/URL or postgresql://", field="queue-url")

    def _sqlite_engine(self, parsed):
        db = parsed.database
        if not db or db == ":memory:":
            raise InputError("an in-memory SQLite queue cannot be shared; give a file path",
                             field="queue-url")
        if not Path(db).parent.exists():
            raise InputError(f"directory of SQLite queue {db} does not exist", field="queue-url")
        if Path(db).is_dir():
            raise InputError(f"SQLite queue {db} is a directory, not a database file",
                             field="queue-url")
        if not self.create and not Path(db).is_file():
            raise QueueError(f"no review queue at {db} (create it with `protdp review init-db "
                             f"--queue-url {db}`)")
        busy_s = self.busy_timeout_s
        engine = create_engine(parsed, connect_args={"timeout": busy_s})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (SQLAlchemy recipe)
            cur = dbapi_conn.cursor()
            _enable_wal(cur, max(busy_s, 5.0))
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):
            readonly = conn.get_execution_options().get("protdp_readonly", False)
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        return engine

    def _pg_engine(self, parsed):
        if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None:
            # SQLAlchemy 2.1 defaults to psycopg 3; protdp[postgres] installs psycopg2.
            parsed = parsed.set(drivername="postgresql+psycopg2")
        try:
            engine = create_engine(parsed, pool_pre_ping=True)
        except NoSuchModuleError as exc:
            raise QueueError(f"{self.safe_url}: {exc} (pip install 'protdp[postgres]')") from None
        lock_ms = max(1, int(self.busy_timeout_s * 1000))

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute(f"SET lock_timeout = {lock_ms}")
            cur.execute(f"SET statement_timeout = {int(STATEMENT_TIMEOUT_S * 1000)}")
            cur.execute("SET idle_in_transaction_session_timeout = "
                        f"{int(IDLE_IN_TRANSACTION_S * 1000)}")
            cur.close()
            dbapi_conn.commit()

        return engine

    @contextlib.contextmanager
    def tx(self, readonly: bool = False) -> Iterator[Connection]:
        """One transaction; database errors become one-line `QueueError`/`QueueBusy`."""
        try:
            conn = self.engine.connect()
        except DBAPIError as exc:
            detail = "; ".join(ln.strip() for ln in str(exc.orig).strip().splitlines())
            raise QueueError(f"cannot open review queue {self.safe_url}: {detail}") from None
        try:
            with conn:
                conn.execution_options(protdp_readonly=readonly)
                conn.info["review_key"] = self.key
                with conn.begin():
                    yield conn
        except DBAPIError as exc:
            if _is_lock_timeout(exc):
                raise QueueBusy(f"review queue {self.safe_url} is busy: another process held "
                                f"its write lock for more than {self.busy_timeout_s:g} s; "
                                "try again") from None
            first = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else exc
            raise QueueError(f"review queue {self.safe_url}: {first}") from None

    def now(self, conn: Connection) -> float:
        """The database server's clock, epoch seconds (the only clock the queue uses)."""
        return float(conn.exec_driver_sql(_NOW_SQL[self.dialect]).scalar())

    def chain_lock(self, conn: Connection) -> None:
        """Serialise audit-log appends (SQLite: BEGIN IMMEDIATE already holds the write lock)."""
        if self.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CHAIN_LOCK_KEY})

    def ensure_schema(self) -> None:
        """Create the tables on first use, migrate older versions, refuse newer ones."""
        from protdp.review.migrate import migrate

        with self.tx() as conn:
            if self.dialect == "postgresql":  # serialise concurrent first use on many nodes
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK_KEY})
            if not inspect(conn).has_table("review_meta"):
                if not self.create:
                    raise QueueError(f"{self.safe_url} is not a review queue (no review_meta "
                                     "table); nothing was changed")
                self.ensure_key(conn)
                metadata.create_all(conn)
                for ddl in APPEND_ONLY_DDL[self.dialect] + INSERT_GUARD_DDL[self.dialect]:
                    conn.exec_driver_sql(ddl)
                conn.execute(review_meta.insert(), [
                    {"key": "schema_version", "value": str(SCHEMA_VERSION)},
                    *({"key": k, "value": str(v)} for k, v in DEFAULT_LIMITS.items())])
                return
            found = conn.execute(select(review_meta.c.value)
                                 .where(review_meta.c.key == "schema_version")).scalar()
            if found is None or not found.isdigit() or int(found) > SCHEMA_VERSION:
                raise QueueError(f"{self.safe_url}: queue schema version {found} is not one this "
                                 f"protdp understands (<= {SCHEMA_VERSION}); upgrade protdp")
            if int(found) < SCHEMA_VERSION:
                self.ensure_key(conn)
                migrate(self, conn, int(found))

    def ensure_key(self, conn: Connection) -> bytes:
        """The audit key, created (0600) where none exists yet (queue creation, migration)."""
        if self.key is None:
            self.key = keys.create_key(self.key_path)
        conn.info["review_key"] = self.key
        return self.key

    def close(self) -> None:
        self.engine.dispose()
