"""The work queue's database: a SQLite file (one node) or a PostgreSQL server (several nodes),
through SQLAlchemy, with the database's clock and bounded lock waits.

Opened like the review queue's, by the shared `protdp.sqlengine`:

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
from pathlib import Path
from typing import Iterator

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from protdp import sqlengine
from protdp.errors import InputError, ProtdpError
from protdp.sqlengine import normalize_url  # noqa: F401  (re-exported: protdp.workqueue)

BUSY_TIMEOUT_S = 60.0        # a claim waits this long for another rank's write lock
_READONLY_OPTION = "workqueue_readonly"   # execution option: BEGIN, not BEGIN IMMEDIATE


class WorkQueueError(ProtdpError):
    """The work queue's database cannot be opened or used (one line, no traceback)."""


class Engine:
    """Engine, transactions and clock of the work queue at `url`."""

    def __init__(self, url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S):
        self.url = normalize_url(url)
        self.busy_timeout_s = float(busy_timeout_s)
        parsed, self.dialect, self.safe_url = sqlengine.parse_url(self.url, "work-queue-url")
        if self.dialect == "sqlite":
            self.engine = self._sqlite(parsed)
        elif self.dialect == "postgresql":
            self.engine = sqlengine.postgres_engine(parsed, self.busy_timeout_s,
                                                    safe_url=self.safe_url,
                                                    error=WorkQueueError)
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
        return sqlengine.sqlite_engine(parsed, self.busy_timeout_s,
                                       readonly_option=_READONLY_OPTION)

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
                conn.execution_options(**{_READONLY_OPTION: readonly})
                with conn.begin():
                    yield conn
        except DBAPIError as exc:       # a lost connection too (InterfaceError), not only
            first = (str(exc.orig).strip().splitlines() or [""])[0]     # OperationalError
            raise WorkQueueError(f"work queue {self.safe_url}: {first}") from None

    def now(self, conn: Connection) -> float:
        """The database's clock, epoch seconds (the only clock leases use)."""
        return sqlengine.database_now(conn, self.dialect)

    def close(self) -> None:
        self.engine.dispose()
