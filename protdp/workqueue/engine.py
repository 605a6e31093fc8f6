"""The work queue's database: a SQLite file (one node) or a PostgreSQL server (several nodes),
through SQLAlchemy, with the database's clock and bounded lock waits.

Built like the review queue's (`protdp.review.db`, a floor above, so not imported here):

- SQLite: WAL (readers never block the writer), `busy_timeout` so a writer waits for the lock
  instead of failing at once, and `BEGIN IMMEDIATE` for every write transaction, so a claim
  (read the next free item, mark it taken) holds the write lock from its first read and two
  ranks can never take the same item.
- PostgreSQL: claims read with `SELECT ... FOR UPDATE SKIP LOCKED` (rows another rank is
  claiming are passed over, not waited for); `lock_timeout` bounds every other wait.
- Time is the database's (`now`), never a client's: lease expiry compares one clock, so a node
  whose clock runs ahead cannot take a live lease.
"""

from __future__ import annotations

import contextlib
import importlib.util
import random
import sqlite3
import time
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError

from protdp.errors import InputError, ProtdpError

BUSY_TIMEOUT_S = 60.0        # a claim waits this long for another rank's write lock
_NOW_SQL = {"sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
            "postgresql": "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8"}


class WorkQueueError(ProtdpError):
    """The work queue's database cannot be opened or used (one line, no traceback)."""


def normalize_url(url: str) -> str:
    """A URL passes through; a bare path means a SQLite file there."""
    if "://" in url:
        return url
    return f"sqlite:///{Path(url).expanduser().resolve()}"


def _wal(cursor, busy_s: float) -> None:
    """WAL mode (persistent). Switching needs an exclusive lock that SQLite refuses at once,
    without its busy handler, while another rank opens the same new file: retry a while."""
    deadline = time.monotonic() + busy_s
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02 + 0.1 * random.random())


class Engine:
    """Engine, transactions and clock of the work queue at `url`."""

    def __init__(self, url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S):
        self.url = normalize_url(url)
        self.busy_timeout_s = float(busy_timeout_s)
        try:
            parsed = make_url(self.url)
        except ArgumentError as exc:
            raise InputError(f"not a database URL: {exc}", field="work-queue-url") from None
        self.dialect = parsed.get_backend_name()
        self.safe_url = parsed.render_as_string(hide_password=True)
        if self.dialect == "sqlite":
            self.engine = self._sqlite(parsed)
        elif self.dialect == "postgresql":
            self.engine = self._postgres(parsed)
        else:
            raise InputError(f"unsupported work-queue database '{self.dialect}' in "
                             f"{self.safe_url}; use a SQLite path or postgresql://",
                             field="work-queue-url")

    def _sqlite(self, parsed):
        db = parsed.database
        if not db or db == ":memory:":
            raise InputError("an in-memory SQLite work queue cannot be shared; give a file",
                             field="work-queue-url")
        if not Path(db).parent.is_dir():
            raise InputError(f"folder of the SQLite work queue {db} does not exist",
                             field="work-queue-url")
        busy_s = self.busy_timeout_s
        engine = create_engine(parsed, connect_args={"timeout": busy_s,
                                                     "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None     # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            _wal(cur, max(busy_s, 5.0))
            cur.execute(f"PRAGMA busy_timeout = {int(busy_s * 1000)}")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):
            readonly = conn.get_execution_options().get("workqueue_readonly", False)
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        return engine

    def _postgres(self, parsed):
        if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None:
            parsed = parsed.set(drivername="postgresql+psycopg2")
        try:
            engine = create_engine(parsed, pool_pre_ping=True)
        except NoSuchModuleError as exc:
            raise WorkQueueError(f"{self.safe_url}: {exc} (pip install 'protdp[postgres]')"
                                 ) from None
        lock_ms = max(1, int(self.busy_timeout_s * 1000))

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute(f"SET lock_timeout = {lock_ms}")
            cur.close()
            dbapi_conn.commit()

        return engine

    @contextlib.contextmanager
    def tx(self, readonly: bool = False) -> Iterator[Connection]:
        """One transaction (write: the SQLite write lock from its first statement); database
        errors become one-line `WorkQueueError`s."""
        try:
            conn = self.engine.connect()
        except DBAPIError as exc:
            first = (str(exc.orig).strip().splitlines() or [""])[0]
            raise WorkQueueError(f"cannot open work queue {self.safe_url}: {first}") from None
        try:
            with conn:
                conn.execution_options(workqueue_readonly=readonly)
                with conn.begin():
                    yield conn
        except OperationalError as exc:
            first = (str(exc.orig).strip().splitlines() or [""])[0]
            raise WorkQueueError(f"work queue {self.safe_url}: {first}") from None

    def now(self, conn: Connection) -> float:
        """The database's clock, epoch seconds (the only clock leases use)."""
        return float(conn.exec_driver_sql(_NOW_SQL[self.dialect]).scalar())

    def close(self) -> None:
        self.engine.dispose()
