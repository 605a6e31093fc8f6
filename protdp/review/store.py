"""The review queue (SQLAlchemy Core; a SQLite file or PostgreSQL): reading it, and the doors
to changing it.

Items move pending -> claimed (a lease) -> approved / rejected / escalated. A lease that ran
out (database time) reads as pending at once; the row changes when someone claims or decides
the item, never on a read, so GET requests and `list` write nothing. Every change appends to
the hash-chained audit log in the same transaction (`protdp.review.audit`).

Authority: the store hands out `Reviewer` (claims, decisions) only for a reviewer token or a
live web session, and `Admin` (reviewers, releases, limits) only for an admin token; the
predictor gets `Enqueuer`, which can only enqueue. `init_admin` creates the first admin of a
queue that has none (`protdp review init-db`).

Atomicity: on PostgreSQL a claim selects its row `FOR UPDATE SKIP LOCKED`, so concurrent
reviewers never block on or double-claim an item; on SQLite every write transaction is
`BEGIN IMMEDIATE`. Each update re-checks the state it expects in its WHERE clause.
Tokens carry 256 random bits and only their SHA-256 is stored.

`scores` per item is a JSON object (sequence, plddt per residue, mean_plddt, afdb_bands, band,
very_low_fraction, ptm, msa_depth, msa_rows_used, msa_coverage, length, num_recycles); files
are the item's `folder` plus bare names in `paths` (`protdp.review.files`).
Create one `ReviewStore` per process (engines do not survive fork).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import secrets
from dataclasses import dataclass

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.engine import Connection

from protdp.errors import InputError
from protdp.review import audit, rehash
from protdp.review.actions import (Admin, AuthError, Credential, Reviewer, add_reviewer_row,
                                   authorize, read_limits, session_hash, token_hash)
from protdp.review.db import DEFAULT_BUSY_TIMEOUT_S, DEFAULT_QUEUE_URL, Database, normalize_url
from protdp.review.enqueue import Enqueuer
from protdp.review.errors import (ClaimConflict, ItemNotFound, QueueBusy, QueueError)
from protdp.review.rows import iso, item_dict
from protdp.review.schema import (ACTIONS, FINAL_STATES, ID_MAX, SCHEMA_VERSION, STATES, events,
                                  items, reviewers, sessions)

__all__ = ["ACTIONS", "AuthError", "ClaimConflict", "DEFAULT_QUEUE_URL", "EXPORT_FORMATS",
           "FINAL_STATES", "ItemNotFound", "Principal", "QueueBusy", "QueueError",
           "ReviewStore", "SCHEMA_VERSION", "SORT_KEYS", "STATES", "iso", "normalize_url",
           "token_hash"]

EXPORT_FORMATS = ("jsonl", "csv")
SESSION_SECONDS = 8 * 3600
SORT_KEYS = ("id", "target", "mean_plddt", "length", "msa_depth", "very_low_fraction",
             "created_at")


@dataclass(frozen=True)
class Principal:
    """Who a web session belongs to, and the CSRF token its forms must carry."""

    name: str
    is_admin: bool
    csrf: str


def csrf_for(session_token: str) -> str:
    """The CSRF token of a session (a cross-site page cannot know the session cookie)."""
    return hashlib.sha256(b"protdp-csrf:" + session_token.encode()).hexdigest()


def _csv_cell(value) -> str:
    """Neutralise spreadsheet formulas in user text (OWASP CSV injection)."""
    s = "" if value is None else str(value)
    return "'" + s if s[:1] in ("=", "+", "-", "@", "\t", "\r") else s


def _state_filter(state: str | None, now: float):
    """SQL condition for an *effective* state (an expired claim is pending)."""
    expired = and_(items.c.state == "claimed", items.c.lease_expires_at <= now)
    if state is None or state == "all":
        return None
    if state == "open":
        return items.c.state.in_(("pending", "claimed"))
    if state == "pending":
        return or_(items.c.state == "pending", expired)
    if state == "claimed":
        return and_(items.c.state == "claimed", items.c.lease_expires_at > now)
    if state in FINAL_STATES:
        return items.c.state == state
    raise InputError(f"state must be one of {list(STATES) + ['open', 'all']}, got {state!r:.40}",
                     field="state")


class ReviewStore:
    """The review queue at `url` (SQLite path/URL or `postgresql://...`); creates/migrates schema."""

    def __init__(self, url: str = DEFAULT_QUEUE_URL, *,
                 busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, create: bool = True):
        """`create=False`: an existing queue only (readers must not create one by accident)."""
        self.db = Database(url, busy_timeout_s=busy_timeout_s, create=create)
        self.db.ensure_schema()
        self.url, self.dialect, self.safe_url = self.db.url, self.db.dialect, self.db.safe_url
        self.engine = self.db.engine
        self._enqueuer = Enqueuer(self.db)

    def close(self) -> None:
        self.db.close()

    # -- the doors: enqueue (anyone with the URL), reviewer / admin (a token) --------------

    def enqueue(self, prediction_id: str, target: str, scores: dict, paths: dict,
                reasons: list[str], *, details: dict | None = None, actor: str = "gate",
                rebind: bool = False) -> int:
        """Add a prediction for review (see `Enqueuer.enqueue`)."""
        return self._enqueuer.enqueue(prediction_id, target, scores, paths, reasons,
                                      details=details, actor=actor, rebind=rebind)

    def reviewer(self, token: str | None = None, *, session: str | None = None,
                 checked: tuple[str, bool] | None = None) -> Reviewer:
        """Claims and decisions for a reviewer token (or a web session token); `checked`
        skips the up-front check when the caller has just made it (each action re-checks)."""
        cred = Credential("session", session) if session is not None \
            else Credential("token", token or "")
        return Reviewer(self.db, cred, checked=checked)

    def admin(self, token: str | None = None, *, session: str | None = None) -> Admin:
        """Reviewer management, releases and limits for an admin token (or admin session)."""
        cred = Credential("session", session) if session is not None \
            else Credential("token", token or "")
        return Admin(self.db, cred)

    def init_admin(self, name: str = "admin") -> str:
        """Create the first admin of a queue that has none; returns its token (shown once)."""
        with self.db.tx() as conn:
            now = self.db.now(conn)
            if conn.execute(select(reviewers.c.name).where(reviewers.c.is_admin)).first():
                raise QueueError("this queue already has an admin; an admin adds more with "
                                 "`protdp review add-reviewer NAME --admin`")
            return add_reviewer_row(self.db, conn, now, "init-db", name, admin=True)

    def set_files_roots(self, roots: list) -> list[str]:
        """Fix the queue's file roots (`init-db --files-root`; before the first admin)."""
        from protdp.review.roots import set_roots

        with self.db.tx() as conn:
            return set_roots(conn, roots)

    def files_roots(self) -> list:
        from protdp.review.roots import read_roots

        with self.db.tx(readonly=True) as conn:
            return read_roots(conn, self.db)

    def grant_role(self, role: str, kind: str) -> list[str]:
        """PostgreSQL grants for the application ("app") or predictor ("enqueue") role."""
        from protdp.review.pgroles import grant

        with self.db.tx() as conn:
            return grant(conn, role, kind)

    def authenticate(self, token: str | None) -> str | None:
        """Reviewer name for a valid, active token; None otherwise."""
        try:
            return self.reviewer(token).name
        except AuthError:
            return None

    # -- web sessions ----------------------------------------------------------------------

    def login(self, token: str, session_seconds: float = SESSION_SECONDS
              ) -> tuple[str, Principal]:
        """A new server-side session for a reviewer token: (session token, principal)."""
        with self.db.tx() as conn:
            now = self.db.now(conn)
            name, is_admin = authorize(conn, Credential("token", token or ""), now)
            conn.execute(delete(sessions).where(sessions.c.expires_at < now - 86400))
            session = secrets.token_urlsafe(32)
            conn.execute(sessions.insert().values(token_sha256=session_hash(conn, session),
                                                  reviewer=name,
                                                  created_at=now,
                                                  expires_at=now + session_seconds))
        return session, Principal(name, is_admin, csrf_for(session))

    def session(self, session_token: str | None) -> Principal | None:
        """The principal of a live session (not logged out, not expired, reviewer active)."""
        if not session_token:
            return None
        with self.db.tx(readonly=True) as conn:
            try:
                name, is_admin = authorize(conn, Credential("session", session_token),
                                           self.db.now(conn))
            except AuthError:
                return None
        return Principal(name, is_admin, csrf_for(session_token))

    def logout(self, session_token: str) -> None:
        """End a session server-side (a replayed cookie stops working at once)."""
        with self.db.tx() as conn:
            conn.execute(update(sessions).where(sessions.c.token_sha256 == session_hash(
                conn, session_token), sessions.c.revoked_at.is_(None))
                .values(revoked_at=self.db.now(conn)))

    # -- reading (never writes) --------------------------------------------------------------

    def get(self, item_id: int) -> dict:
        with self.db.tx(readonly=True) as conn:
            return self._get(conn, item_id)

    def _get(self, conn: Connection, item_id: int) -> dict:
        if isinstance(item_id, bool) or not isinstance(item_id, int) or not 1 <= item_id <= ID_MAX:
            raise ItemNotFound(f"no review item with id {item_id!r:.40}")
        row = conn.execute(select(items).where(items.c.id == item_id)).mappings().first()
        if row is None:
            raise ItemNotFound(f"no review item with id {item_id}")
        return item_dict(row, self.db.now(conn))

    def _filtered(self, query, now: float, state, reason, target):
        cond = _state_filter(state, now)
        if cond is not None:
            query = query.where(cond)
        if reason:
            query = query.where(items.c.reason_codes.contains(f",{reason},", autoescape=True))
        if target:
            query = query.where(func.lower(items.c.target).contains(target.lower(),
                                                                    autoescape=True))
        return query

    def list(self, state: str | None = None, *, reason: str | None = None,
             target: str | None = None, limit: int = 100, offset: int = 0, sort: str = "id",
             descending: bool = False) -> list[dict]:
        """Items. `state`: one of STATES (effective: an expired claim is pending), "open"
        (pending + claimed), "all"/None; `reason`: a reason code; `target`: case-insensitive
        substring; `sort`: one of SORT_KEYS (ties by id)."""
        if sort not in SORT_KEYS:
            raise InputError(f"sort must be one of {list(SORT_KEYS)}, got {sort!r:.40}",
                             field="sort")
        col = items.c[sort]
        order = col.desc() if descending else col.asc()
        with self.db.tx(readonly=True) as conn:
            now = self.db.now(conn)
            query = self._filtered(select(items), now, state, reason, target)
            query = query.order_by(order.nulls_last(), items.c.id).limit(limit).offset(offset)
            return [item_dict(r, now) for r in conn.execute(query).mappings()]

    def count(self, state: str | None = None, *, reason: str | None = None,
              target: str | None = None) -> int:
        """How many items `list` would return without a limit."""
        with self.db.tx(readonly=True) as conn:
            now = self.db.now(conn)
            query = self._filtered(select(func.count()).select_from(items), now, state, reason,
                                   target)
            return int(conn.execute(query).scalar())

    def neighbours(self, item_id: int) -> tuple[int | None, int | None]:
        """(previous, next) open item ids around `item_id` in queue order (for j/k)."""
        with self.db.tx(readonly=True) as conn:
            return self._neighbours(conn, item_id)

    def _neighbours(self, conn: Connection, item_id: int) -> tuple[int | None, int | None]:
        open_ = items.c.state.in_(("pending", "claimed"))
        prev = conn.execute(select(func.max(items.c.id)).where(open_, items.c.id < item_id)
                            ).scalar()
        nxt = conn.execute(select(func.min(items.c.id)).where(open_, items.c.id > item_id)
                           ).scalar()
        return prev, nxt

    def item_view(self, item_id: int) -> dict:
        """One consistent read for the item page: item, its events, neighbours, limits."""
        with self.db.tx(readonly=True) as conn:
            item = self._get(conn, item_id)
            prev_id, next_id = self._neighbours(conn, item["id"])
            trail = [dict(r) for r in conn.execute(select(events).where(
                events.c.item_id == item["id"]).order_by(events.c.seq)).mappings()]
            return {"item": item, "events": trail, "prev_id": prev_id, "next_id": next_id,
                    "limits": read_limits(conn)}

    def held_by(self, reviewer: str) -> list[dict]:
        """Items `reviewer` holds under a live lease, oldest first."""
        with self.db.tx(readonly=True) as conn:
            now = self.db.now(conn)
            rows = conn.execute(select(items).where(
                _state_filter("claimed", now), items.c.claimed_by == reviewer)
                .order_by(items.c.id)).mappings()
            return [item_dict(r, now) for r in rows]

    def events(self, item_id: int | None = None) -> list[dict]:
        """The audit trail (all items, or one), oldest first."""
        query = select(events).order_by(events.c.seq)
        if item_id is not None:
            query = query.where(events.c.item_id == item_id)
        with self.db.tx(readonly=True) as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def reviewers(self) -> list[dict]:
        """Reviewers (name, active, is_admin, created_at), without token hashes."""
        with self.db.tx(readonly=True) as conn:
            return [dict(r) for r in conn.execute(
                select(reviewers.c.name, reviewers.c.active, reviewers.c.is_admin,
                       reviewers.c.created_at).order_by(reviewers.c.name)).mappings()]

    def limits(self) -> dict[str, int]:
        with self.db.tx(readonly=True) as conn:
            return read_limits(conn)

    def verify(self, expect_head: str | None = None, *, files: bool = True) -> dict:
        """Recompute the audit chain and replay it against items and reviewers, then (`files`)
        re-hash every file the items are bound to (`protdp.review.rehash`)."""
        with self.db.tx(readonly=True) as conn:
            report = audit.verify(conn, expect_head)
        return rehash.check_files(self.db, report) if files else report

    def export_records(self) -> list[dict]:
        """Decided items with their features and full audit trail, oldest decision first."""
        with self.db.tx(readonly=True) as conn:
            decided = conn.execute(select(items).where(items.c.state.in_(FINAL_STATES))
                                   .order_by(items.c.decided_at, items.c.id)).mappings().all()
            trail: dict[int, list[dict]] = {}
            bound: dict[int, str | None] = {}
            for ev in conn.execute(select(events).join(items, events.c.item_id == items.c.id)
                                   .where(items.c.state.in_(FINAL_STATES))
                                   .order_by(events.c.seq)).mappings():
                if ev["action"] in ACTIONS.values():       # the decision's bound digest
                    bound[ev["item_id"]] = ev["bound_sha256"]
                trail.setdefault(ev["item_id"], []).append(
                    {"at": iso(ev["at"]), "actor": ev["actor"], "action": ev["action"],
                     "comment": ev["comment"]})
        return [{
            "item_id": r["id"], "prediction_id": r["prediction_id"], "target": r["target"],
            "decision": r["state"], "decided_by": r["decided_by"], "decided_at": iso(r["decided_at"]),
            "comment": r["comment"], "reasons": r["reasons"], "mean_plddt": r["mean_plddt"],
            "band": r["band"], "very_low_fraction": r["very_low_fraction"],
            "msa_depth": r["msa_depth"], "length": r["length"],
            "afdb_bands": (r["scores"] or {}).get("afdb_bands"), "folder": r["folder"],
            "paths": r["paths"], "events": trail.get(r["id"], []),
            "file_sha256": r["file_sha256"], "superseded_by": r["superseded_by"],
            "scores": r["scores"], "bound_sha256": bound.get(r["id"]),
        } for r in decided]

    def export(self, fmt: str = "jsonl") -> str:
        """Decided items with their full audit trail, as JSON lines or CSV."""
        if fmt not in EXPORT_FORMATS:
            raise InputError(f"format must be one of {EXPORT_FORMATS}, got {fmt!r:.40}",
                             field="format")
        records = [{k: v for k, v in rec.items() if k != "scores"}
                   for rec in self.export_records()]
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
        """Counts by effective state and by reviewer decision, age of the oldest pending item."""
        with self.db.tx(readonly=True) as conn:
            now = self.db.now(conn)
            by_state = dict.fromkeys(STATES, 0)
            for state, n in conn.execute(select(items.c.state, func.count())
                                         .group_by(items.c.state)):
                by_state[state] = n
            expired = conn.execute(select(func.count()).select_from(items).where(
                items.c.state == "claimed", items.c.lease_expires_at <= now)).scalar()
            by_state["claimed"] -= expired
            by_state["pending"] += expired
            by_reviewer: dict[str, dict[str, int]] = {}
            for who, state, n in conn.execute(
                    select(items.c.decided_by, items.c.state, func.count())
                    .where(items.c.state.in_(FINAL_STATES))
                    .group_by(items.c.decided_by, items.c.state)):
                by_reviewer.setdefault(who, dict.fromkeys(FINAL_STATES, 0))[state] = n
            oldest = conn.execute(select(func.min(items.c.created_at)).where(
                _state_filter("pending", now))).scalar()
        return {"total": sum(by_state.values()), "by_state": by_state, "by_reviewer": by_reviewer,
                "oldest_pending_age_s": None if oldest is None else round(now - oldest, 3)}
