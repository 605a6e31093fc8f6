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
from pathlib import Path
from typing import Iterator

from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from protdp import sqlengine
from protdp.errors import InputError
from protdp.review import keys
from protdp.review.errors import QueueBusy, QueueError
from protdp.review.schema import (APPEND_ONLY_DDL, DEFAULT_LIMITS, INSERT_GUARD_DDL,
                                  SCHEMA_VERSION, metadata, review_meta)
from protdp.sqlengine import normalize_url  # noqa: F401  (re-exported: review.store, workflows)

DEFAULT_QUEUE_URL = "sqlite:///review_queue.sqlite"
DEFAULT_BUSY_TIMEOUT_S = 10.0       # interactive: reviewers get a clear "busy" after this
BATCH_BUSY_TIMEOUT_S = 60.0         # the predictor enqueues in a batch and may wait longer
CHAIN_LOCK_KEY = 7310567             # pg_advisory_xact_lock key serialising audit appends
_SCHEMA_LOCK_KEY = 7310566
STATEMENT_TIMEOUT_S = 30.0          # PostgreSQL: one statement at most (verify/export included)
IDLE_IN_TRANSACTION_S = 60.0        # PostgreSQL: a client stalled inside a transaction
_READONLY_OPTION = "protdp_readonly"  # execution option: BEGIN, not BEGIN IMMEDIATE


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
        parsed, self.dialect, self.safe_url = sqlengine.parse_url(self.url, "queue-url")
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
        return sqlengine.sqlite_engine(parsed, self.busy_timeout_s,
                                       readonly_option=_READONLY_OPTION,
                                       pragmas=("foreign_keys=ON",))

    def _pg_engine(self, parsed):
        return sqlengine.postgres_engine(
            parsed, self.busy_timeout_s, safe_url=self.safe_url, error=QueueError,
            settings=(f"SET statement_timeout = {int(STATEMENT_TIMEOUT_S * 1000)}",
                      "SET idle_in_transaction_session_timeout = "
                      f"{int(IDLE_IN_TRANSACTION_S * 1000)}"))

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
                conn.execution_options(**{_READONLY_OPTION: readonly})
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
        return sqlengine.database_now(conn, self.dialect)

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
