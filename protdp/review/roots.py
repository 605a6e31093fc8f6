"""The queue's file roots: the folders under which an item's prediction files may lie, fixed
when the queue is initialised (`protdp review init-db --files-root DIR`, repeatable; a SQLite
queue created without any defaults to its own folder, where `protdp predict` writes next to
it). Enqueue refuses an item whose folder lies outside them, and the server serves files only
under them (or under its own `--files-root`, which narrows what it serves); a queue with no
roots (PostgreSQL without `--files-root`) serves no files at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.engine import Connection

from protdp.errors import InputError
from protdp.review.errors import QueueError
from protdp.review.schema import reviewers, review_meta

META_KEY = "files_roots"


def default_roots(db) -> list[str]:
    if db.dialect == "sqlite":
        return [str(Path(db.engine.url.database).resolve().parent)]
    return []


def read_roots(conn: Connection, db) -> list[Path]:
    stored = conn.execute(select(review_meta.c.value).where(review_meta.c.key == META_KEY)
                          ).scalar()
    roots = json.loads(stored) if stored else default_roots(db)
    return [Path(r) for r in roots]


def set_roots(conn: Connection, roots: list[str | Path]) -> list[str]:
    """Fix the roots of a queue that has no admin yet (`init-db`); later they never change."""
    if conn.execute(select(reviewers.c.id).where(reviewers.c.is_admin)).first():
        raise QueueError("the queue's file roots are fixed when it is initialised; this queue "
                         "already has an admin (serve with --files-root to narrow them)")
    resolved = [str(Path(r).expanduser().resolve()) for r in roots]
    value = json.dumps(resolved)
    if len(value) > 255:
        raise InputError("file roots longer than 255 characters in all", field="--files-root")
    if conn.execute(select(review_meta.c.key).where(review_meta.c.key == META_KEY)).first():
        conn.execute(review_meta.update().where(review_meta.c.key == META_KEY)
                     .values(value=value))
    else:
        conn.execute(review_meta.insert().values(key=META_KEY, value=value))
    return resolved


def check_folder(folder: str | None, roots: list[Path]) -> None:
    """InputError unless `folder` (links resolved) lies under one of `roots`."""
    if folder is None:
        return
    real = Path(folder).resolve()
    if not any(real.is_relative_to(r.resolve()) for r in roots):
        raise InputError(f"the prediction folder {folder} lies outside the queue's file roots "
                         f"{[str(r) for r in roots] or '(none configured)'}; files there would "
                         "never be served (protdp review init-db --files-root)", field="paths")
