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

The same prediction id is the same item, with one exception the caller asks for (`rebind`): it
has just written the files itself (a damaged prediction folder set aside and predicted again)
and the item's bound bytes are not those files. That item could never be approved (its bytes
are gone), so the prediction is queued again as `<prediction id>~<n>`, which supersedes it. A
plain re-enqueue (a rerun finding the prediction complete) never rebinds: files that changed
under an item are refused at review, not taken on as new bytes.
"""

from __future__ import annotations

from sqlalchemy import or_, select, update
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
REBIND_SEPARATOR = "~"
"""`<prediction id>~<n>`: the n-th item of one prediction id, queued again with new bytes."""
MAX_PREDICTION_ID = 500


def _number(value, kind):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value)


def item_row(prediction_id, target, scores, paths, reasons, details) -> dict:
    """The items row for an enqueue (pure: validation and normalisation only)."""
    if not isinstance(prediction_id, str) or not prediction_id:
        raise InputError("must be a non-empty string", field="prediction_id")
    prediction_id = escape_controls(prediction_id)
    if len(prediction_id) > MAX_PREDICTION_ID:
        raise InputError(f"longer than {MAX_PREDICTION_ID} characters", field="prediction_id")
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
                reasons: list[str], *, details: dict | None = None, actor: str = "gate",
                rebind: bool = False) -> int:
        """Add a prediction for review; the same `prediction_id` maps to one item (the newest
        of its `~n` items). `rebind`: the caller has just written these files, so an item whose
        bound bytes differ is superseded by a new one (see the module docstring)."""
        if not isinstance(actor, str) or not NAME_RE.match(actor):
            raise InputError(f"actor {str(actor)[:40]!r} must be a plain name", field="actor")
        row = item_row(prediction_id, target, scores, paths, reasons, details)
        row["file_sha256"] = file_digests(row)
        db = self._db
        with db.tx() as conn:
            check_folder(row["folder"], read_roots(conn, db))
            row["created_at"] = db.now(conn)
            asked = row["prediction_id"]
            while (new_id := self._insert(conn, row)) is None:
                kin = _same_prediction(conn, asked)
                newest_id, _, bound = kin[-1]
                if not rebind or bound == row["file_sha256"]:
                    return newest_id
                row["prediction_id"] = rebound_id(asked, 1 + max(
                    int(pid.rpartition(REBIND_SEPARATOR)[2]) if pid != asked else 1
                    for _, pid, _ in kin))
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

    def _insert(self, conn, row: dict) -> int | None:
        """The new item's id; None when its prediction id is queued already."""
        insert = (_UPSERT_INSERT[self._db.dialect](items).values(**row)
                  .on_conflict_do_nothing(index_elements=["prediction_id"])
                  .returning(items.c.id))
        return conn.execute(insert).scalar()

    def close(self) -> None:
        self._db.close()


def rebound_id(prediction_id: str, n: int) -> str:
    """The prediction id of the n-th item of `prediction_id` (n >= 2)."""
    out = f"{prediction_id}{REBIND_SEPARATOR}{n}"
    if len(out) > MAX_PREDICTION_ID:
        raise InputError(f"longer than {MAX_PREDICTION_ID} characters once queued again",
                         field="prediction_id")
    return out


def _same_prediction(conn, prediction_id: str) -> list[tuple]:
    """(id, prediction id, bound file digests) of every item of `prediction_id`: itself and its
    `~n` items, oldest first."""
    prefix = prediction_id + REBIND_SEPARATOR
    rows = conn.execute(select(items.c.id, items.c.prediction_id, items.c.file_sha256).where(
        or_(items.c.prediction_id == prediction_id,
            items.c.prediction_id.startswith(prefix, autoescape=True)))
        .order_by(items.c.id)).all()
    return [(r.id, r.prediction_id, r.file_sha256) for r in rows
            if r.prediction_id == prediction_id or r.prediction_id[len(prefix):].isdigit()]
