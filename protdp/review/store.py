"""Human review queue for gated predictions (SQLAlchemy Core; SQLite file or PostgreSQL).

Items move pending -> claimed (a lease with an expiry) -> approved / rejected / escalated; an
expired lease makes the item claimable again (and `expire_leases` returns it to pending). Every
change writes a row to an append-only event log (who, when, what, comment) in the same
transaction, so the audit trail and the item state cannot disagree. Database triggers refuse
UPDATE/DELETE on the log.

Atomicity: on PostgreSQL a claim selects its row `FOR UPDATE SKIP LOCKED`, so concurrent
reviewers on many nodes never block on or double-claim an item; on SQLite every write
transaction is `BEGIN IMMEDIATE` (one writer at a time, WAL so readers do not block). Each
update re-checks the state it expects in its WHERE clause as a second guard.

Reviewers authenticate with a random token shown once; only its SHA-256 is stored (the token
carries 256 random bits, so a fast hash is enough: there is nothing to brute-force).

`scores` stored per item is a JSON object; the UI reads `plddt` (list, per residue),
`mean_plddt` and `afdb_bands` from it. `paths` maps a kind (`pdb`, `cif`, ...) to a file path.
Create one `ReviewStore` per process (engines do not survive fork).
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import hashlib
import importlib.util
import io
import json
import math
import re
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Callable, Iterator

from sqlalchemy import (JSON, Boolean, CheckConstraint, Column, Float, ForeignKey, Index, Integer,
                        MetaData, String, Table, Text, and_, create_engine, event, func, inspect,
                        or_, select, text, update)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from protdp.errors import InputError, ProtdpError

SCHEMA_VERSION = 1
DEFAULT_QUEUE_URL = "sqlite:///review_queue.sqlite"
STATES = ("pending", "claimed", "approved", "rejected", "escalated")
FINAL_STATES = ("approved", "rejected", "escalated")
ACTIONS = {"approve": "approved", "reject": "rejected", "escalate": "escalated"}
EXPORT_FORMATS = ("jsonl", "csv")
MAX_LEASE_SECONDS = 24 * 3600
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_CODE_RE = re.compile(r"^[a-z0-9_]{1,64}$")


class QueueError(ProtdpError):
    """The queue cannot do what was asked (unreachable database, unknown reviewer, ...)."""


class ItemNotFound(QueueError):
    """No item with that id."""


class ClaimConflict(QueueError):
    """The item is decided already or held by another reviewer's live lease."""


metadata = MetaData()

review_meta = Table(
    "review_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(255), nullable=False),
)

reviewers = Table(
    "reviewers", metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("active", Boolean, nullable=False),
    Column("created_at", Float, nullable=False),
)

items = Table(
    "review_items", metadata,
    Column("id", Integer, primary_key=True),
    Column("prediction_id", String(500), nullable=False, unique=True),
    Column("target", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reasons", JSON, nullable=False),
    Column("reason_codes", Text, nullable=False),  # ",code1,code2," for portable LIKE filtering
    Column("details", JSON, nullable=False),
    Column("scores", JSON, nullable=False),
    Column("paths", JSON, nullable=False),
    Column("mean_plddt", Float),
    Column("created_at", Float, nullable=False),
    Column("claimed_by", String(64)),
    Column("lease_expires_at", Float),
    Column("decided_by", String(64)),
    Column("decided_at", Float),
    Column("comment", Text),
    CheckConstraint("state IN ('pending', 'claimed', 'approved', 'rejected', 'escalated')",
                    name="review_items_state_ck"),
    Index("review_items_state_id", "state", "id"),
)

events = Table(
    "review_events", metadata,
    Column("id", Integer, primary_key=True),
    Column("item_id", Integer, ForeignKey("review_items.id"), nullable=False, index=True),
    Column("at", Float, nullable=False),
    Column("actor", String(64), nullable=False),
    Column("action", String(32), nullable=False),
    Column("comment", Text),
)

_APPEND_ONLY_DDL = {
    "sqlite": [
        "CREATE TRIGGER review_events_no_update BEFORE UPDATE ON review_events "
        "BEGIN SELECT RAISE(ABORT, 'review_events is append-only'); END",
        "CREATE TRIGGER review_events_no_delete BEFORE DELETE ON review_events "
        "BEGIN SELECT RAISE(ABORT, 'review_events is append-only'); END",
    ],
    "postgresql": [
        "CREATE OR REPLACE FUNCTION review_events_append_only() RETURNS trigger AS $$ "
        "BEGIN RAISE EXCEPTION 'review_events is append-only'; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER review_events_append_only BEFORE UPDATE OR DELETE ON review_events "
        "FOR EACH ROW EXECUTE FUNCTION review_events_append_only()",
    ],
}


_UPSERT_INSERT = {"sqlite": sqlite_insert, "postgresql": pg_insert}


def normalize_url(url: str) -> str:
    """A URL passes through; a bare path means a SQLite file there."""
    if "://" in url:
        return url
    return f"sqlite:///{Path(url).expanduser().resolve()}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def iso(ts: float | None) -> str | None:
    """Epoch seconds -> ISO 8601 UTC (what exports and pages show)."""
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def _jsonable(obj, where: str):
    """Plain JSON (numpy scalars/arrays become lists; NaN/inf become null)."""
    def default(o):
        if hasattr(o, "tolist"):
            return o.tolist()
        raise InputError(f"value of type {type(o).__name__} is not JSON-serialisable", field=where)

    def scrub(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {str(k): scrub(v) for k, v in o.items()}
        if isinstance(o, list):
            return [scrub(v) for v in o]
        return o

    return scrub(json.loads(json.dumps(obj, default=default)))


def _csv_cell(value) -> str:
    """Neutralise spreadsheet formulas in user text (OWASP CSV injection)."""
    s = "" if value is None else str(value)
    return "'" + s if s[:1] in ("=", "+", "-", "@", "\t", "\r") else s


def _item(row) -> dict:
    """An items row as the plain dict callers see (without the internal filter column)."""
    out = dict(row)
    out.pop("reason_codes")
    return out


def _enable_wal(cursor, busy_s: float) -> None:
    """Put the SQLite file in WAL mode (persistent, so only the first opener changes it).

    Switching the journal mode needs an exclusive lock and SQLite answers "database is locked"
    at once, without its busy handler, when another process is opening the same new file (two
    prediction ranks at start-up): retry until `busy_s` has passed.
    """
    deadline = time.monotonic() + busy_s
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05 + 0.1 * secrets.randbelow(100) / 100)


class ReviewStore:
    """The review queue at `url` (SQLite path/URL or `postgresql://...`); creates/migrates schema."""

    def __init__(self, url: str = DEFAULT_QUEUE_URL, *, clock: Callable[[], float] = time.time):
        self.url = normalize_url(url)
        self._clock = clock
        try:
            parsed = make_url(self.url)
        except ArgumentError as exc:
            raise InputError(f"not a database URL: {exc}", field="queue-url") from None
        self.dialect = parsed.get_backend_name()
        self.safe_url = parsed.render_as_string(hide_password=True)
        if self.dialect == "sqlite":
            self.engine = self._sqlite_engine(parsed)
        elif self.dialect == "postgresql":
            if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None:
                # SQLAlchemy 2.1 defaults to psycopg 3; protdp[postgres] installs psycopg2.
                parsed = parsed.set(drivername="postgresql+psycopg2")
            try:
                self.engine = create_engine(parsed, pool_pre_ping=True)
            except NoSuchModuleError as exc:
                raise QueueError(f"{self.safe_url}: {exc} (pip install 'protdp[postgres]')") from None
        else:
            raise InputError(f"unsupported queue database '{self.dialect}' in {self.safe_url}; "
                             "use a SQLite path/URL or postgresql://", field="queue-url")
        self._migrate()

    # -- engine and transactions ------------------------------------------------------------

    def _sqlite_engine(self, parsed):
        db = parsed.database
        if not db or db == ":memory:":
            raise InputError("an in-memory SQLite queue cannot be shared; give a file path",
                             field="queue-url")
        if not Path(db).parent.exists():
            raise InputError(f"directory of SQLite queue {db} does not exist", field="queue-url")
        busy_s = 60.0
        engine = create_engine(parsed, connect_args={"timeout": busy_s})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (SQLAlchemy recipe)
            cur = dbapi_conn.cursor()
            _enable_wal(cur, busy_s)
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):
            readonly = conn.get_execution_options().get("protdp_readonly", False)
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        return engine

    @contextlib.contextmanager
    def _tx(self, readonly: bool = False) -> Iterator[Connection]:
        try:
            conn = self.engine.connect()
        except DBAPIError as exc:
            raise QueueError(f"cannot open review queue {self.safe_url}: "
                             f"{str(exc.orig).strip()}") from None
        with conn:
            conn.execution_options(protdp_readonly=readonly)
            with conn.begin():
                yield conn

    def _migrate(self) -> None:
        with self._tx() as conn:
            if self.dialect == "postgresql":  # serialise concurrent first use on many nodes
                conn.execute(text("SELECT pg_advisory_xact_lock(7310566)"))
            if not inspect(conn).has_table("review_meta"):
                metadata.create_all(conn)
                for ddl in _APPEND_ONLY_DDL[self.dialect]:
                    conn.exec_driver_sql(ddl)
                conn.execute(review_meta.insert().values(key="schema_version",
                                                         value=str(SCHEMA_VERSION)))
                return
            found = conn.execute(select(review_meta.c.value)
                                 .where(review_meta.c.key == "schema_version")).scalar()
            if found is None or int(found) > SCHEMA_VERSION:
                raise QueueError(f"{self.safe_url}: queue schema version {found} is not one this "
                                 f"protdp understands (<= {SCHEMA_VERSION}); upgrade protdp")
            # Future migrations: apply steps int(found)+1 .. SCHEMA_VERSION here, then bump.

    def close(self) -> None:
        self.engine.dispose()

    # -- reviewers --------------------------------------------------------------------------

    def add_reviewer(self, name: str) -> str:
        """Create reviewer `name`; returns its token (shown once, stored only as a hash)."""
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise InputError(f"reviewer name {name!r} must be 1-64 of letters, digits, '_.@-'",
                             field="name")
        token = "pdr_" + secrets.token_urlsafe(32)
        with self._tx() as conn:
            if conn.execute(select(reviewers.c.id).where(reviewers.c.name == name)).first():
                raise QueueError(f"reviewer '{name}' already exists")
            conn.execute(reviewers.insert().values(name=name, token_sha256=token_hash(token),
                                                   active=True, created_at=self._clock()))
        return token

    def deactivate_reviewer(self, name: str) -> None:
        """Revoke a reviewer's token (their past events stay in the log)."""
        with self._tx() as conn:
            res = conn.execute(update(reviewers).where(reviewers.c.name == name)
                               .values(active=False))
            if res.rowcount != 1:
                raise QueueError(f"no reviewer named '{name}'")

    def authenticate(self, token: str | None) -> str | None:
        """Reviewer name for a valid, active token; None otherwise."""
        if not token or not isinstance(token, str) or len(token) > 200:
            return None
        with self._tx(readonly=True) as conn:
            return conn.execute(select(reviewers.c.name).where(
                reviewers.c.token_sha256 == token_hash(token), reviewers.c.active)).scalar()

    def is_active_reviewer(self, name: str) -> bool:
        with self._tx(readonly=True) as conn:
            return conn.execute(select(reviewers.c.id).where(
                reviewers.c.name == name, reviewers.c.active)).first() is not None

    def _require_reviewer(self, conn: Connection, name: str) -> None:
        if conn.execute(select(reviewers.c.id).where(reviewers.c.name == name,
                                                     reviewers.c.active)).first() is None:
            raise QueueError(f"'{name}' is not an active reviewer")

    # -- items --------------------------------------------------------------------------------

    def enqueue(self, prediction_id: str, target: str, scores: dict, paths: dict,
                reasons: list[str], *, details: dict | None = None, actor: str = "gate") -> int:
        """Add a prediction for review; the same `prediction_id` always maps to one item."""
        if not isinstance(prediction_id, str) or not prediction_id or len(prediction_id) > 500:
            raise InputError("must be a non-empty string of at most 500 characters",
                             field="prediction_id")
        if not isinstance(target, str):
            raise InputError("must be a string", field="target")
        if not isinstance(scores, dict) or not isinstance(paths, dict):
            raise InputError("scores and paths must be dicts", field="scores")
        bad = [r for r in reasons if not isinstance(r, str) or not _CODE_RE.match(r)]
        if isinstance(reasons, str) or bad:
            raise InputError(f"reason codes must be lowercase identifiers, got {bad or reasons!r}",
                             field="reasons")
        scores = _jsonable(scores, "scores")
        mean = scores.get("mean_plddt")
        row = dict(prediction_id=prediction_id, target=target, state="pending",
                   reasons=list(reasons), reason_codes="," + ",".join(reasons) + ",",
                   details=_jsonable(details or {}, "details"), scores=scores,
                   paths={str(k): str(v) for k, v in paths.items()},
                   mean_plddt=float(mean) if isinstance(mean, (int, float)) else None,
                   created_at=self._clock())
        insert = (_UPSERT_INSERT[self.dialect](items).values(**row)
                  .on_conflict_do_nothing(index_elements=["prediction_id"])
                  .returning(items.c.id))
        with self._tx() as conn:
            new_id = conn.execute(insert).scalar()
            if new_id is None:
                return conn.execute(select(items.c.id).where(
                    items.c.prediction_id == prediction_id)).scalar_one()
            conn.execute(events.insert().values(item_id=new_id, at=row["created_at"], actor=actor,
                                                action="enqueued", comment=None))
            return new_id

    def _claimable(self, now: float, reviewer: str):
        return or_(items.c.state == "pending",
                   and_(items.c.state == "claimed",
                        or_(items.c.lease_expires_at <= now, items.c.claimed_by == reviewer)))

    def claim(self, reviewer: str, lease_seconds: float = 900, *,
              item_id: int | None = None) -> dict | None:
        """Lease the oldest claimable item (or `item_id`) to `reviewer`; None when none is left.

        Claimable: pending, or claimed with an expired lease, or (renewal) claimed by `reviewer`.
        """
        if not 0 < lease_seconds <= MAX_LEASE_SECONDS:
            raise InputError(f"lease must be in (0, {MAX_LEASE_SECONDS}] seconds, got "
                             f"{lease_seconds}", field="lease")
        now = self._clock()
        with self._tx() as conn:
            self._require_reviewer(conn, reviewer)
            claimable = self._claimable(now, reviewer)
            if item_id is None:
                claimable = and_(claimable, or_(items.c.claimed_by.is_(None),
                                                items.c.claimed_by != reviewer))
            query = select(items.c.id, items.c.state, items.c.claimed_by).where(claimable)
            if item_id is None:
                query = query.order_by(items.c.id).limit(1)
            else:
                query = query.where(items.c.id == item_id)
            row = conn.execute(query.with_for_update(skip_locked=True)).first()
            if row is None:
                if item_id is None:
                    return None
                self._explain_unavailable(conn, item_id, now)
            if row.state == "claimed" and row.claimed_by != reviewer:
                self._log(conn, row.id, now, "system", "lease_expired",
                          f"lease of {row.claimed_by} expired")
            new = conn.execute(update(items).where(items.c.id == row.id, claimable).values(
                state="claimed", claimed_by=reviewer, lease_expires_at=now + lease_seconds)
                .returning(*items.c)).mappings().first()
            if new is None:
                raise ClaimConflict(f"item {row.id} changed while claiming; try again")
            self._log(conn, row.id, now, reviewer, "claimed", f"lease {lease_seconds:g} s")
            return _item(new)

    def decide(self, item_id: int, reviewer: str, action: str, comment: str = "") -> dict:
        """approve / reject / escalate an item. Allowed when it is pending, claimed by
        `reviewer`, or claimed under an expired lease. Reject and escalate need a comment."""
        if action not in ACTIONS:
            raise InputError(f"action must be one of {sorted(ACTIONS)}, got {action!r}",
                             field="action")
        comment = (comment or "").strip()
        if action != "approve" and not comment:
            raise InputError(f"a comment is required to {action}", field="comment")
        if len(comment) > 10_000:
            raise InputError("comment longer than 10000 characters", field="comment")
        now = self._clock()
        with self._tx() as conn:
            self._require_reviewer(conn, reviewer)
            decidable = self._claimable(now, reviewer)
            row = conn.execute(select(items.c.id, items.c.state, items.c.claimed_by)
                               .where(items.c.id == item_id, decidable)
                               .with_for_update()).first()
            if row is None:
                self._explain_unavailable(conn, item_id, now)
            if row.state == "claimed" and row.claimed_by != reviewer:
                self._log(conn, row.id, now, "system", "lease_expired",
                          f"lease of {row.claimed_by} expired")
            state = ACTIONS[action]
            new = conn.execute(update(items).where(items.c.id == item_id, decidable).values(
                state=state, decided_by=reviewer, decided_at=now, comment=comment or None,
                claimed_by=None, lease_expires_at=None).returning(*items.c)).mappings().first()
            if new is None:
                raise ClaimConflict(f"item {item_id} changed while deciding; try again")
            self._log(conn, item_id, now, reviewer, state, comment or None)
            return _item(new)

    def _explain_unavailable(self, conn: Connection, item_id: int, now: float):
        row = conn.execute(select(items).where(items.c.id == item_id)).first()
        if row is None:
            raise ItemNotFound(f"no review item with id {item_id}")
        if row.state in FINAL_STATES:
            raise ClaimConflict(f"item {item_id} was already {row.state} by {row.decided_by} "
                                f"at {iso(row.decided_at)}")
        if row.state == "claimed" and row.lease_expires_at > now:
            raise ClaimConflict(f"item {item_id} is claimed by {row.claimed_by} until "
                                f"{iso(row.lease_expires_at)}")
        raise ClaimConflict(f"item {item_id} is locked by another reviewer right now; try again")

    def expire_leases(self) -> int:
        """Return items whose lease ran out to pending; returns how many."""
        now = self._clock()
        with self._tx() as conn:
            rows = conn.execute(select(items.c.id, items.c.claimed_by).where(
                items.c.state == "claimed", items.c.lease_expires_at <= now)
                .with_for_update(skip_locked=True)).all()
            for row in rows:
                conn.execute(update(items).where(items.c.id == row.id, items.c.state == "claimed")
                             .values(state="pending", claimed_by=None, lease_expires_at=None))
                self._log(conn, row.id, now, "system", "lease_expired",
                          f"lease of {row.claimed_by} expired")
            return len(rows)

    def _log(self, conn: Connection, item_id: int, at: float, actor: str, action: str,
             comment: str | None) -> None:
        conn.execute(events.insert().values(item_id=item_id, at=at, actor=actor, action=action,
                                            comment=comment))

    # -- reading ------------------------------------------------------------------------------

    def _get(self, conn: Connection, item_id: int) -> dict:
        row = conn.execute(select(items).where(items.c.id == item_id)).mappings().first()
        if row is None:
            raise ItemNotFound(f"no review item with id {item_id}")
        return _item(row)

    def get(self, item_id: int) -> dict:
        with self._tx(readonly=True) as conn:
            return self._get(conn, item_id)

    def list(self, state: str | None = None, *, reason: str | None = None,
             target: str | None = None, limit: int = 100, offset: int = 0) -> list[dict]:
        """Items, oldest first. `state`: one of STATES, "open" (pending + claimed) or None (all);
        `reason`: a reason code; `target`: case-insensitive substring of the target name."""
        self.expire_leases()
        query = select(items).order_by(items.c.id).limit(limit).offset(offset)
        if state == "open":
            query = query.where(items.c.state.in_(("pending", "claimed")))
        elif state is not None:
            if state not in STATES:
                raise InputError(f"state must be one of {list(STATES) + ['open']}, got {state!r}",
                                 field="state")
            query = query.where(items.c.state == state)
        if reason:
            query = query.where(items.c.reason_codes.contains(f",{reason},", autoescape=True))
        if target:
            query = query.where(func.lower(items.c.target).contains(target.lower(),
                                                                    autoescape=True))
        with self._tx(readonly=True) as conn:
            return [_item(r) for r in conn.execute(query).mappings()]

    def events(self, item_id: int | None = None) -> list[dict]:
        """The audit trail (all items, or one), oldest first."""
        query = select(events).order_by(events.c.id)
        if item_id is not None:
            query = query.where(events.c.item_id == item_id)
        with self._tx(readonly=True) as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def export(self, fmt: str = "jsonl") -> str:
        """Decided items with their full audit trail, as JSON lines or CSV."""
        if fmt not in EXPORT_FORMATS:
            raise InputError(f"format must be one of {EXPORT_FORMATS}, got {fmt!r}", field="format")
        with self._tx(readonly=True) as conn:
            decided = conn.execute(select(items).where(items.c.state.in_(FINAL_STATES))
                                   .order_by(items.c.decided_at, items.c.id)).mappings().all()
            trail: dict[int, list[dict]] = {}
            for ev in conn.execute(select(events).join(items, events.c.item_id == items.c.id)
                                   .where(items.c.state.in_(FINAL_STATES))
                                   .order_by(events.c.id)).mappings():
                trail.setdefault(ev["item_id"], []).append(
                    {"at": iso(ev["at"]), "actor": ev["actor"], "action": ev["action"],
                     "comment": ev["comment"]})
        records = [{
            "item_id": r["id"], "prediction_id": r["prediction_id"], "target": r["target"],
            "decision": r["state"], "decided_by": r["decided_by"], "decided_at": iso(r["decided_at"]),
            "comment": r["comment"], "reasons": r["reasons"], "mean_plddt": r["mean_plddt"],
            "afdb_bands": (r["scores"] or {}).get("afdb_bands"), "paths": r["paths"],
            "events": trail.get(r["id"], []),
        } for r in decided]
        if fmt == "jsonl":
            return "".join(json.dumps(rec, sort_keys=True) + "\n" for rec in records)
        buf = io.StringIO()
        cols = ["item_id", "prediction_id", "target", "decision", "decided_by", "decided_at",
                "comment", "reasons", "mean_plddt", "audit_trail"]
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(cols)
        for rec in records:
            writer.writerow([rec["item_id"], _csv_cell(rec["prediction_id"]),
                             _csv_cell(rec["target"]), rec["decision"], rec["decided_by"],
                             rec["decided_at"], _csv_cell(rec["comment"]), ";".join(rec["reasons"]),
                             rec["mean_plddt"], json.dumps(rec["events"])])
        return buf.getvalue()

    def stats(self) -> dict:
        """Counts by state and by reviewer decision, and the age of the oldest pending item."""
        self.expire_leases()
        now = self._clock()
        with self._tx(readonly=True) as conn:
            by_state = dict.fromkeys(STATES, 0)
            for state, n in conn.execute(select(items.c.state, func.count())
                                         .group_by(items.c.state)):
                by_state[state] = n
            by_reviewer: dict[str, dict[str, int]] = {}
            for who, state, n in conn.execute(
                    select(items.c.decided_by, items.c.state, func.count())
                    .where(items.c.state.in_(FINAL_STATES))
                    .group_by(items.c.decided_by, items.c.state)):
                by_reviewer.setdefault(who, dict.fromkeys(FINAL_STATES, 0))[state] = n
            oldest = conn.execute(select(func.min(items.c.created_at))
                                  .where(items.c.state == "pending")).scalar()
        return {"total": sum(by_state.values()), "by_state": by_state, "by_reviewer": by_reviewer,
                "oldest_pending_age_s": None if oldest is None else round(now - oldest, 3)}
