"""`verify`'s file pass: re-hash every file an item is bound to and name each one whose bytes
are no longer the ones recorded at enqueue.

An approval binds the sha256 of every file of the item (`protdp.review.binding`); the digests
are part of the content digest in the item's `enqueued` event, which its signed decision event
binds (`bound_sha256`), so the recorded digests cannot be edited without `verify`'s chain pass
naming the item. This pass checks the other half: that the files on disk are still those bytes.

Which items: every item that is not rejected and not superseded (pending, claimed, escalated
and approved: what a reviewer is shown or what export trains on). A rejected item's files are
never served or exported, so deleting them is housekeeping; a superseded item's folder may
have been predicted again (`rebind`). Items queued before protdp bound bytes (no digests) are
counted, not checked.

Which files: each kind the item names plus scores.json and provenance.json (provenance only if
it was present at enqueue) and every `msa:<path>` recorded; the `checkpoint` entry is a digest
the predictor names, not a file. A file is hashed in 1 MiB blocks through O_NOFOLLOW; a link,
a non-regular file, a missing file, different bytes, or a file that appeared where none was
recorded is a problem. Items are read in pages of `PAGE` in short transactions (hashing a large
queue must not hold a transaction open), and at most `MAX_FILE_PROBLEMS` problems are kept
(all are counted), so memory stays bounded however large the queue.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Iterator

from sqlalchemy import select

from protdp.review.files import item_files
from protdp.review.schema import items

PAGE = 500
MAX_FILE_PROBLEMS = 1000
CHUNK_BYTES = 1 << 20
CHECKED_STATES = ("pending", "claimed", "escalated", "approved")


def file_state(path: Path) -> tuple[str, str | None]:
    """("file", sha256) for a regular file (hashed in chunks, links never followed), else
    ("missing" | "symlink" | "not a regular file" | "unreadable", None)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing", None
    except OSError:
        return "unreadable", None
    if stat.S_ISLNK(st.st_mode):
        return "symlink", None
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file", None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return "unreadable", None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return "not a regular file", None
        for block in iter(lambda: fh.read(CHUNK_BYTES), b""):
            h.update(block)
    return "file", h.hexdigest()


def bound_files(row: dict) -> Iterator[tuple[str, Path, str | None]]:
    """(kind, path, recorded sha256 or None for absent) of every file the item is bound to."""
    recorded = row["file_sha256"]
    folder = Path(row["folder"])
    for kind, name in sorted(item_files(row).items()):
        if kind == "provenance" and recorded.get(kind) is None:
            continue       # written after enqueue (it names the item id): not bound
        yield kind, folder / name, recorded.get(kind)
    for name, digest in sorted(recorded.items()):
        if name.startswith("msa:"):
            yield "msa", Path(name[4:]), digest


def _problem(item_id: int, kind: str, path: Path, want: str | None, found: str,
             got: str | None) -> dict | None:
    """The problem of one file, or None when it is the recorded bytes (or still absent)."""
    if want is None:
        if found == "missing":
            return None
        what = "appeared after enqueue (none was bound)"
    elif found == "file":
        if got == want:
            return None
        what = "changed since enqueue"
    else:
        what = {"missing": "missing", "symlink": "now a symlink"}.get(found, f"now {found}")
    return {"item_id": item_id, "kind": kind, "file": str(path), "problem": what,
            "expected_sha256": want, "found_sha256": got,
            "line": f"item {item_id}: {kind} file {path} {what} (expected sha256 {want}, "
                    f"found {got or found})"}


def item_file_problems(row: dict) -> Iterator[dict]:
    """Every bound file of one item whose bytes are not the recorded ones."""
    for kind, path, want in bound_files(row):
        found, got = file_state(path)
        problem = _problem(row["id"], kind, path, want, found, got)
        if problem is not None:
            yield problem


def _pages(db) -> Iterator[list[dict]]:
    """The checked items' rows, `PAGE` at a time, each page read in its own transaction."""
    cols = (items.c.id, items.c.folder, items.c.paths, items.c.file_sha256)
    after = 0
    while True:
        with db.tx(readonly=True) as conn:
            page = [dict(r) for r in conn.execute(
                select(*cols).where(items.c.id > after, items.c.state.in_(CHECKED_STATES),
                                    items.c.superseded_by.is_(None))
                .order_by(items.c.id).limit(PAGE)).mappings()]
        if not page:
            return
        yield page
        after = page[-1]["id"]


def check_files(db, report: dict) -> dict:
    """Add the file pass to a `protdp.review.audit.verify` report (in place; returned)."""
    kept, count, checked, unbound, bad = [], 0, 0, 0, set(report["bad_items"])
    for page in _pages(db):
        for row in page:
            if not row["file_sha256"] or not row["folder"]:
                unbound += row["file_sha256"] is None and bool(row["folder"])
                continue
            checked += 1
            for problem in item_file_problems(row):
                count += 1
                bad.add(row["id"])
                if len(kept) < MAX_FILE_PROBLEMS:
                    kept.append(problem)
    report.update(ok=report["ok"] and count == 0, bad_items=sorted(bad),
                  items_files_checked=checked, items_without_digests=unbound,
                  file_problems=kept, more_file_problems=count - len(kept))
    return report
