"""Where a prediction lives: OUT/targets/<target>/<prediction_id>/, one folder per prediction.

- `prediction_id` is the first 16 hex digits of the prediction's fingerprint (checkpoints,
  seeds, settings, gate policy / calibration, sequence, MSA): the same inputs give the same
  folder, so a rerun finds finished work; anything new gives a new folder (and a new review
  item) and the older one is left untouched.
- A folder is built as a hidden `.<id>.partial-<pid>` sibling and renamed into place when
  every file is written, so `<id>/` never holds half a prediction; a crash leaves only a
  `.partial` folder, which the next run deletes and redoes.
- `provenance.json` is written last (after the review item exists): it marks the prediction
  complete. A folder without it was renamed into place but not yet handed to the queue: the
  rerun enqueues it again (idempotent per prediction id) without touching its files.
- A published folder that lost a file (someone deleted it) is never written into: it is
  renamed aside to `.<id>.damaged-<time>` (kept for audit) and the prediction redone; its
  review item, bound to the bytes set aside, is superseded by a new one (`<queue id>~2`)
  bound to the redone files (`protdp.review.enqueue`, rebind).
- `OUT/targets/<target>/CURRENT` (one line: the prediction id) names the latest prediction.
- The sha256 of every output is recorded at publish (`outputs_sha256`); a folder whose
  outputs are not those bytes, or are links, is not done (`outputs_intact`): it is set aside
  and redone, never handed to the review queue as it is.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from protdp.fileio import sha256_file

CURRENT_FILE = "CURRENT"
PARTIAL_MARK = ".partial-"
PREDICTION_ID_DIGITS = 16


def prediction_id(fingerprint: str) -> str:
    return fingerprint[:PREDICTION_ID_DIGITS]


def target_dir(targets_dir: Path, file_name: str) -> Path:
    return targets_dir / file_name


def prediction_dir(targets_dir: Path, file_name: str, pid: str) -> Path:
    return targets_dir / file_name / pid


def remove_partials(tdir: Path, pid: str) -> None:
    """Delete half-written builds of this prediction left by a crashed run (ours by name)."""
    if not tdir.is_dir():
        return
    for p in tdir.iterdir():
        if p.name.startswith(f".{pid}{PARTIAL_MARK}") and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)


def start_build(tdir: Path, pid: str) -> Path:
    """A fresh hidden folder to write the prediction into."""
    tdir.mkdir(parents=True, exist_ok=True)
    remove_partials(tdir, pid)
    build = tdir / f".{pid}{PARTIAL_MARK}{os.getpid()}"
    build.mkdir()
    return build


def publish_build(build: Path, final: Path) -> Path:
    """Rename the finished build into place (atomic on one file system). `final` must not
    exist: a published prediction is never overwritten."""
    message = f"{final} exists: a published prediction is never overwritten"
    if final.exists():
        raise FileExistsError(message)
    try:
        os.replace(build, final)
    except OSError as exc:       # another process published it meanwhile: a directory renamed
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):    # onto a non-empty one is ENOTEMPTY
            raise FileExistsError(message) from None
        raise
    return final


def write_current(tdir: Path, pid: str) -> Path:
    """OUT/targets/<target>/CURRENT <- pid (atomic)."""
    path = tdir / CURRENT_FILE
    tmp = tdir / f".{CURRENT_FILE}.tmp{os.getpid()}"
    tmp.write_text(pid + "\n")
    os.replace(tmp, path)
    return path


def current_prediction(tdir: str | Path) -> Path | None:
    """The folder CURRENT names (None when there is none yet)."""
    tdir = Path(tdir)
    try:
        pid = (tdir / CURRENT_FILE).read_text().strip()
    except OSError:
        return None
    return tdir / pid if pid and "/" not in pid and pid not in (".", "..") else None


def set_aside_damaged(pdir: Path) -> Path:
    """Rename a damaged published prediction folder out of the way (never delete or write
    into it); returns its new path."""
    import time
    stem = f".{pdir.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    dest, n = pdir.with_name(stem), 1
    while os.path.lexists(dest):       # set aside twice within one second by one process
        dest, n = pdir.with_name(f"{stem}.{n}"), n + 1
    os.replace(pdir, dest)
    return dest


def _regular(path: Path) -> bool:
    """A regular file itself (a link planted in a prediction folder is not one of ours)."""
    return path.is_file() and not path.is_symlink()


def outputs_intact(pdir: Path, record: dict) -> bool:
    """Every output the record lists is a regular file of ours with the bytes written (its
    `outputs_sha256`; a prediction from before it was recorded: present is enough), so a
    truncated or swapped ranked_*.pdb / PAE JSON / scores.json is never taken as done nor
    handed to the review queue."""
    names = list((record.get("outputs") or {}).values())
    if not all(_regular(pdir / n) for n in names):
        return False
    want = record.get("outputs_sha256")
    return want is None or all(sha256_file(pdir / n) == want.get(n) for n in names)
