"""Checking a review-queue URL before a batch does any work (issue 47, "validate before
work"): `protdp predict` opens its queue lazily, on the first flagged prediction, so a queue
URL that is not a database used to fail only after the first prediction was written. The probe
opens nothing that does not exist yet (a batch where nothing needs review still creates no
queue file): an existing SQLite file must be a SQLite database, a PostgreSQL server must
accept a connection."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from protdp.errors import InputError
from protdp.review.db import Database

SQLITE_MAGIC = b"SQLite format 3\x00"


def probe_queue(url: str) -> None:
    """One InputError / QueueError line when the queue at `url` cannot be used; no file is
    created and no schema is touched."""
    db = Database(url)                        # scheme, in-memory, directory checks
    try:
        if db.dialect == "sqlite":
            path = Path(make_url(db.url).database)
            if path.exists():
                with open(path, "rb") as fh:
                    head = fh.read(len(SQLITE_MAGIC))
                if head and head != SQLITE_MAGIC:
                    raise InputError(f"not a review queue: {path} is not an SQLite database",
                                     field="queue-url")
            return
        with db.tx(readonly=True) as conn:    # PostgreSQL: the server answers
            conn.execute(text("SELECT 1"))
    except OSError as exc:
        raise InputError(f"cannot read the review queue file: {exc.strerror}",
                         field="queue-url") from None
    finally:
        db.engine.dispose()
