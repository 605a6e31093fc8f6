"""The predictor's entry point into the review queue: it can enqueue, and nothing else.

`Enqueuer` is all that `protdp.workflows.QueueSink` (and so `protdp predict`) gets: no reads,
no claims, no decisions, no reviewer management; those go through `ReviewStore.reviewer(token)`
and `ReviewStore.admin(token)`. On PostgreSQL `protdp review init-db --enqueue-role ROLE`
gives the predictor's database role only INSERT (and the SELECTs enqueue needs).

Every string is control-escaped at the door (`hygiene.clean_json`), so a FASTA header with a
NUL byte is queued as `\\x00` instead of failing the batch on every rerun.

At enqueue the queue itself hashes every file of the item (`protdp.review.binding`); a newer
prediction of the same target (another prediction id) marks every older item of that target
`superseded_by` it, with a `superseded` event: such an item can no longer be claimed, decided
or exported.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from protdp.errors import InputError
from protdp.gating import AFDB_BANDS, band_of
from protdp.review import audit
from protdp.review.binding import file_digests
from protdp.review.db import BATCH_BUSY_TIMEOUT_S, Database
from protdp.review.files import split_paths
from protdp.review.hygiene import CODE_RE, NAME_RE, clean_json, escape_controls
from protdp.review.roots import check_folder, read_roots
from protdp.review.schema import items

_UPSERT_INSERT = {"sqlite": sqlite_insert, "postgresql": pg_insert}


def _number(value, kind):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value)


def item_row(prediction_id, target, scores, paths, reasons, details) -> dict:
    """The items row for an enqueue (pure: validation and normalisation only)."""
    if not isinstance(prediction_id, str) or not prediction_id:
        raise InputError("must be a non-empty string", field="prediction_id")
    prediction_id = escape_controls(prediction_id)
    if len(prediction_id) > 500:
        raise InputError("longer than 500 characters", field="prediction_id")
    if not isinstance(target, str):
        raise InputError("must be a string", field="target")
    if not isinstance(scores, dict):
        raise InputError("must be a dict", field="scores")
    if isinstance(reasons, str) or not isinstance(reasons, (list, tuple)) or \
            [r for r in reasons if not isinstance(r, str) or not CODE_RE.match(r)]:
        raise InputError(f"reason codes must be lowercase identifiers, got {reasons!r:.200}",
                         field="reasons")
    scores = clean_json(scores, "scores")
    folder, names = split_paths(paths)
    mean = _number(scores.get("mean_plddt"), float)
    band = scores.get("band")
    if band is None and mean is not None:
        band = band_of(mean)
    if band is not None and band not in AFDB_BANDS:
        raise InputError(f"must be one of {list(AFDB_BANDS)}, got {str(band)[:40]!r}",
                         field="scores.band")
    length = _number(scores.get("length"), int)
    if length is None and isinstance(scores.get("plddt"), list):
        length = len(scores["plddt"])
    return dict(prediction_id=prediction_id, target=escape_controls(target), state="pending",
                reasons=list(reasons), reason_codes="," + ",".join(reasons) + ",",
                details=clean_json(details or {}, "details"), scores=scores, folder=folder,
                paths=names, mean_plddt=mean, band=band, length=length,
                msa_depth=_number(scores.get("msa_depth"), int),
                very_low_fraction=_number(scores.get("very_low_fraction"), float))


class Enqueuer:
    """Adds flagged predictions to the queue at `url`; creates the schema on first use."""

    def __init__(self, url: str | Database, *, busy_timeout_s: float = BATCH_BUSY_TIMEOUT_S):
        if isinstance(url, Database):
            self._db = url
        else:
            self._db = Database(url, busy_timeout_s=busy_timeout_s)
            self._db.ensure_schema()
        self.display = self._db.safe_url

    def enqueue(self, prediction_id: str, target: str, scores: dict, paths: dict,
                reasons: list[str], *, details: dict | None = None, actor: str = "gate") -> int:
        """Add a prediction for review; the same `prediction_id` always maps to one item."""
        if not isinstance(actor, str) or not NAME_RE.match(actor):
            raise InputError(f"actor {str(actor)[:40]!r} must be a plain name", field="actor")
        row = item_row(prediction_id, target, scores, paths, reasons, details)
        row["file_sha256"] = file_digests(row)
        db = self._db
        with db.tx() as conn:
            check_folder(row["folder"], read_roots(conn, db))
            row["created_at"] = db.now(conn)
            insert = (_UPSERT_INSERT[db.dialect](items).values(**row)
                      .on_conflict_do_nothing(index_elements=["prediction_id"])
                      .returning(items.c.id))
            new_id = conn.execute(insert).scalar()
            if new_id is None:
                return conn.execute(select(items.c.id).where(
                    items.c.prediction_id == row["prediction_id"])).scalar_one()
            older = conn.execute(update(items).where(
                items.c.target == row["target"], items.c.id != new_id,
                items.c.superseded_by.is_(None)).values(superseded_by=new_id)
                .returning(items.c.id)).scalars().all()
            audit.append(db, conn, row["created_at"], [
                {"item_id": new_id, "actor": actor, "action": "enqueued",
                 "comment": "sha256 " + audit.content_digest(row)},
                *({"item_id": old, "actor": actor, "action": "superseded",
                   "comment": f"by item {new_id}"} for old in sorted(older))])
            return new_id

    def close(self) -> None:
        self._db.close()
