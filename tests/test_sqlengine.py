"""`protdp.sqlengine`, the one engine recipe of the review queue (`protdp.review.db`) and the
work queue (`protdp.workqueue.engine`): every connection of each queue gets the settings that
queue asks for, on a SQLite file and on a real PostgreSQL server, and on SQLite a write
transaction holds the write lock from its BEGIN while a read-only one does not."""

from __future__ import annotations

import sqlite3
import time

import pytest

from protdp.review.db import IDLE_IN_TRANSACTION_S, STATEMENT_TIMEOUT_S, Database
from protdp.workqueue.engine import Engine
from review_fixtures import queue_url  # noqa: F401  (fixture: SQLite file and PostgreSQL)

BUSY_S = 2.5
KINDS = ("review", "work")


def _opened(kind: str, url: str):
    return Database(url, busy_timeout_s=BUSY_S) if kind == "review" \
        else Engine(url, busy_timeout_s=BUSY_S)


@pytest.mark.parametrize("kind", KINDS)
def test_each_queue_gets_its_connection_settings_and_the_database_clock(kind, queue_url):
    db = _opened(kind, queue_url)
    review = kind == "review"
    try:
        with db.tx(readonly=True) as conn:
            if db.dialect == "sqlite":
                got = {p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                       for p in ("journal_mode", "busy_timeout", "synchronous", "foreign_keys")}
                assert got == {"journal_mode": "wal", "busy_timeout": int(BUSY_S * 1000),
                               "synchronous": 1, "foreign_keys": int(review)}     # 1: NORMAL
            else:
                names = ("lock_timeout", "statement_timeout",
                         "idle_in_transaction_session_timeout")
                got = {n: int(conn.exec_driver_sql(
                    f"SELECT setting FROM pg_settings WHERE name = '{n}'").scalar())
                    for n in names}                                               # ms
                assert got == {"lock_timeout": int(BUSY_S * 1000),
                               "statement_timeout": int(STATEMENT_TIMEOUT_S * 1000) * review,
                               "idle_in_transaction_session_timeout":
                                   int(IDLE_IN_TRANSACTION_S * 1000) * review}
            assert abs(db.now(conn) - time.time()) < 60.0
    finally:
        db.close()


@pytest.mark.parametrize("kind", KINDS)
def test_sqlite_write_transactions_take_the_lock_at_begin(kind, tmp_path):
    path = tmp_path / "queue.sqlite"
    db = _opened(kind, str(path))
    try:
        with db.tx(readonly=True) as conn:
            conn.exec_driver_sql("SELECT 1")
            other = sqlite3.connect(path, timeout=0, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")            # a reader does not hold the write lock
            other.execute("ROLLBACK")
        with db.tx():
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")        # a writer holds it from BEGIN on
        other.close()
    finally:
        db.close()
