"""Authenticated changes to the queue: a reviewer's claims and decisions, an admin's reviewer
management and releases. Nothing here takes a reviewer's *name*: `Reviewer` and `Admin` hold a
credential (a reviewer token or a web session token) that is checked again inside every
transaction, against the database clock, so a removed reviewer or an ended session stops
working at once. `ReviewStore.reviewer(token)` / `.admin(token)` hand these out.

A database row alone is not authority (`protdp.review.keys`): a reviewer is accepted only when
its row matches its own signed audit events (added with this token hash and admin flag, not
removed), and web sessions are stored as HMAC(server key, session token), so a session or
reviewer row inserted with a database credential authorises nothing. A decision event binds the
item's content digest (`bound_sha256`).
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from dataclasses import dataclass

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.engine import Connection

from protdp.errors import InputError
from protdp.review import audit, keys
from protdp.review.errors import AuthError, ClaimConflict, ItemNotFound, QueueError
from protdp.review.hygiene import NAME_RE, check_comment
from protdp.review.rows import iso, item_dict
from protdp.review.schema import (ACTIONS, DEFAULT_LIMITS, FINAL_STATES, ID_MAX, events, items,
                                  review_meta, reviewers, sessions)

MAX_BATCH = 200


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def session_hash(conn: Connection, token: str) -> str:
    """What a web session token is stored as: HMAC(server key, token)."""
    key = conn.info.get("review_key")
    if key is None:
        raise AuthError("web sessions need the queue's audit key, which this process cannot "
                        f"read (set {keys.KEY_ENV})")
    return keys.mac(key, "session|" + token)


def _signed_reviewer(conn: Connection, name: str, token_sha: str, is_admin: bool) -> bool:
    """Whether reviewer `name`'s own signed events say: active, this token, this admin flag."""
    key = conn.info.get("review_key")
    if key is None:
        raise AuthError(f"checking a reviewer needs the queue's audit key (set {keys.KEY_ENV})")
    state = None
    for ev in conn.execute(select(events.c.action, events.c.comment, events.c.hash,
                                  events.c.mac).where(events.c.subject == name)
                           .order_by(events.c.seq)):
        if not keys.same(ev.mac, keys.mac(key, ev.hash)):
            return False
        if ev.action in ("reviewer_added", "admin_added"):
            state = ((ev.comment or "").removeprefix("token sha256 "),
                     ev.action == "admin_added")
        elif ev.action == "reviewer_removed":
            state = None
    return state == (token_sha, bool(is_admin))


def new_token(prefix: str = "pdr_") -> str:
    return prefix + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Credential:
    """A raw reviewer token ("token") or web session token ("session"); never a name."""

    kind: str
    secret: str

    def __repr__(self) -> str:  # never print the secret
        return f"Credential({self.kind}, ***)"


def authorize(conn: Connection, cred: Credential, now: float, *, admin: bool = False
              ) -> tuple[str, bool]:
    """(name, is_admin) for a valid credential at database time `now`, else AuthError."""
    if not isinstance(cred.secret, str) or not cred.secret or len(cred.secret) > 200:
        raise AuthError("no valid reviewer token")
    cols = (reviewers.c.name, reviewers.c.is_admin, reviewers.c.token_sha256)
    if cred.kind == "token":
        row = conn.execute(select(*cols).where(
            reviewers.c.token_sha256 == token_hash(cred.secret), reviewers.c.active)).first()
    else:
        row = conn.execute(
            select(*cols).join(sessions, sessions.c.reviewer == reviewers.c.name)
            .where(sessions.c.token_sha256 == session_hash(conn, cred.secret),
                   sessions.c.revoked_at.is_(None),
                   sessions.c.expires_at > now, reviewers.c.active)).first()
    if row is None:     # name the credential the command asked for (PROTDP_REVIEW_ADMIN_TOKEN)
        raise AuthError(f"{'admin' if admin else 'reviewer'} token not recognised, session "
                        "ended, or reviewer removed")
    if not _signed_reviewer(conn, row.name, row.token_sha256, row.is_admin):
        raise AuthError(f"reviewer '{row.name}' does not match its signed audit events "
                        "(a row written behind the server's back); run `protdp review verify`")
    if admin and not row.is_admin:
        raise AuthError(f"'{row.name}' is not an admin; this needs an admin token")
    return row.name, bool(row.is_admin)


def read_limits(conn: Connection) -> dict[str, int]:
    stored = dict(conn.execute(select(review_meta.c.key, review_meta.c.value)).all())
    return {k: int(stored.get(k, v)) for k, v in DEFAULT_LIMITS.items()}


def claimable(now: float, reviewer: str):
    """Pending, claimed under an expired lease, or held by `reviewer` (SQL condition)."""
    return and_(items.c.superseded_by.is_(None),
                or_(items.c.state == "pending",
                    and_(items.c.state == "claimed",
                         or_(items.c.lease_expires_at <= now, items.c.claimed_by == reviewer))))


def explain_unavailable(conn: Connection, item_id: int, now: float):
    """Raise the error that says why `item_id` cannot be claimed or decided right now."""
    row = conn.execute(select(items).where(items.c.id == item_id)).first()
    if row is None:
        raise ItemNotFound(f"no review item with id {item_id}")
    if row.superseded_by is not None:
        raise ClaimConflict(f"item {item_id} is superseded by item {row.superseded_by} (a newer "
                            "prediction of the same target); review that one")
    if row.state in FINAL_STATES:
        raise ClaimConflict(f"item {item_id} was already {row.state} by {row.decided_by} "
                            f"at {iso(row.decided_at)}")
    if row.state == "claimed" and row.lease_expires_at > now:
        raise ClaimConflict(f"item {item_id} is claimed by {row.claimed_by} until "
                            f"{iso(row.lease_expires_at)}")
    raise ClaimConflict(f"item {item_id} is locked by another reviewer right now; try again")


def _check_id(item_id) -> int:
    if isinstance(item_id, bool) or not isinstance(item_id, int) or not 1 <= item_id <= ID_MAX:
        raise ItemNotFound(f"no review item with id {item_id!r:.40}")
    return item_id


class Reviewer:
    """What an authenticated reviewer may do: claim, renew, release, decide."""

    def __init__(self, db, cred: Credential, *, checked: tuple[str, bool] | None = None):
        """`checked`: (name, is_admin) when the caller has just authenticated `cred` in this
        request (the web server); every action checks the credential again anyway."""
        self._db, self._cred = db, cred
        if checked is None:
            with db.tx(readonly=True) as conn:
                checked = authorize(conn, cred, db.now(conn))
        self.name, self.is_admin = checked

    def _lease(self, conn: Connection, lease_seconds: float | None) -> float:
        lim = read_limits(conn)
        lease = lim["default_lease_seconds"] if lease_seconds is None else lease_seconds
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) \
                or not math.isfinite(lease) or lease <= 0:
            raise InputError(f"lease must be a positive number of seconds, got {lease!r}",
                             field="lease")
        return min(float(lease), float(lim["max_lease_seconds"]))  # the server's maximum

    def claim(self, item_id: int | None = None, lease_seconds: float | None = None
              ) -> dict | None:
        """Lease `item_id`, or the oldest item nobody holds ("claim next"; None when none is
        left). Claiming an item you hold renews it. Bounded by the server's lease maximum and
        its limit on items held at once."""
        item_id = None if item_id is None else _check_id(item_id)
        db = self._db
        with db.tx() as conn:
            now = db.now(conn)
            name, _ = authorize(conn, self._cred, now)
            lease = self._lease(conn, lease_seconds)
            cond = claimable(now, name)
            if item_id is None:
                cond = and_(cond, or_(items.c.claimed_by.is_(None), items.c.claimed_by != name))
            query = select(items.c.id, items.c.state, items.c.claimed_by).where(cond)
            if item_id is None:   # "claim next": not the item this reviewer just gave back
                just_released = select(events.c.seq).where(
                    events.c.seq == items.c.last_event_seq, events.c.action == "released",
                    events.c.actor == name).exists()
                query = query.where(~just_released).order_by(items.c.id).limit(1)
            else:
                query = query.where(items.c.id == item_id)
            row = conn.execute(query.with_for_update(skip_locked=True)).first()
            if row is None:
                if item_id is None:
                    return None
                explain_unavailable(conn, item_id, now)
            renewal = row.state == "claimed" and row.claimed_by == name
            if not renewal:
                self._check_capacity(conn, name, now)
            else:
                lease = self._bounded_renewal(conn, row.id, name, now, lease)
            new = conn.execute(update(items).where(items.c.id == row.id, cond).values(
                state="claimed", claimed_by=name, lease_expires_at=now + lease)
                .returning(*items.c)).mappings().first()
            if new is None:
                raise ClaimConflict(f"item {row.id} changed while claiming; try again")
            log = []
            if row.state == "claimed" and not renewal:
                log.append({"item_id": row.id, "actor": "system", "action": "lease_expired",
                            "comment": f"lease of {row.claimed_by} expired"})
            log.append({"item_id": row.id, "actor": name,
                        "action": "renewed" if renewal else "claimed",
                        "comment": f"lease {lease:g} s until {iso(now + lease)}"})
            audit.append(db, conn, now, log)
            return item_dict(new, now)

    def _bounded_renewal(self, conn: Connection, item_id: int, name: str, now: float,
                         lease: float) -> float:
        """The lease a renewal may take: never past `max_hold_seconds` after the claim."""
        claimed_at = conn.execute(select(func.max(events.c.at)).where(
            events.c.item_id == item_id, events.c.actor == name,
            events.c.action == "claimed")).scalar() or now
        left = claimed_at + read_limits(conn)["max_hold_seconds"] - now
        if left <= 0:
            raise ClaimConflict(f"item {item_id}: renewals end {read_limits(conn)['max_hold_seconds']}"
                                " s after the claim (server limit); decide it or release it")
        return min(lease, left)

    def _check_capacity(self, conn: Connection, name: str, now: float) -> None:
        limit = read_limits(conn)["max_claims_per_reviewer"]
        held = conn.execute(select(func.count()).select_from(items).where(
            items.c.state == "claimed", items.c.claimed_by == name,
            items.c.lease_expires_at > now)).scalar()
        if held >= limit:
            raise ClaimConflict(f"{name} already holds {held} items (the server allows "
                                f"{limit}); decide or release some first")

    def release(self, item_id: int) -> dict:
        """Give back an item you hold (it becomes pending)."""
        item_id = _check_id(item_id)
        db = self._db
        with db.tx() as conn:
            now = db.now(conn)
            name, _ = authorize(conn, self._cred, now)
            new = conn.execute(update(items).where(
                items.c.id == item_id, items.c.state == "claimed", items.c.claimed_by == name)
                .values(state="pending", claimed_by=None, lease_expires_at=None)
                .returning(*items.c)).mappings().first()
            if new is None:
                raise ClaimConflict(f"item {item_id} is not held by {name}")
            audit.append(db, conn, now, [{"item_id": item_id, "actor": name,
                                          "action": "released", "comment": None}])
            return item_dict(new, now)

    def decide(self, item_id: int, action: str, comment: str = "") -> dict:
        """approve / reject / escalate; allowed when the item is pending, held by you, or
        held under an expired lease. Reject and escalate need a comment."""
        if action not in ACTIONS:
            raise InputError(f"action must be one of {sorted(ACTIONS)}, got {action!r:.40}",
                             field="action")
        comment = check_comment(comment)
        if action != "approve" and not comment:
            raise InputError(f"a comment is required to {action}", field="comment")
        item_id = _check_id(item_id)
        db = self._db
        with db.tx() as conn:
            now = db.now(conn)
            name, _ = authorize(conn, self._cred, now)
            cond = claimable(now, name)
            row = conn.execute(select(items.c.id, items.c.state, items.c.claimed_by)
                               .where(items.c.id == item_id, cond).with_for_update()).first()
            if row is None:
                explain_unavailable(conn, item_id, now)
            state = ACTIONS[action]
            new = conn.execute(update(items).where(items.c.id == item_id, cond).values(
                state=state, decided_by=name, decided_at=now, comment=comment or None,
                claimed_by=None, lease_expires_at=None).returning(*items.c)).mappings().first()
            if new is None:
                raise ClaimConflict(f"item {item_id} changed while deciding; try again")
            log = []
            if row.state == "claimed" and row.claimed_by != name:
                log.append({"item_id": item_id, "actor": "system", "action": "lease_expired",
                            "comment": f"lease of {row.claimed_by} expired"})
            log.append({"item_id": item_id, "actor": name, "action": state,
                        "comment": comment or None,
                        "bound_sha256": audit.content_digest(dict(new))})
            audit.append(db, conn, now, log)
            return item_dict(new, now)

    def decide_many(self, item_ids: list[int], action: str, comment: str = "") -> dict[int, str]:
        """The same decision and comment for a selection; one transaction per item, so one
        conflict does not undo the rest. Returns {id: new state or the reason it failed}."""
        if not item_ids:
            raise InputError("select at least one item", field="ids")
        if len(item_ids) > MAX_BATCH:
            raise InputError(f"at most {MAX_BATCH} items at once", field="ids")
        out = {}
        for item_id in dict.fromkeys(item_ids):
            try:
                out[item_id] = self.decide(item_id, action, comment)["state"]
            except (ClaimConflict, ItemNotFound) as exc:
                out[item_id] = str(exc)
        return out


class Admin:
    """What an admin token may do: manage reviewers, release claims, set server limits."""

    def __init__(self, db, cred: Credential):
        self._db, self._cred = db, cred
        with db.tx(readonly=True) as conn:
            self.name, _ = authorize(conn, cred, db.now(conn), admin=True)

    def _begin(self, conn: Connection) -> tuple[float, str]:
        now = self._db.now(conn)
        return now, authorize(conn, self._cred, now, admin=True)[0]

    def add_reviewer(self, name: str, *, admin: bool = False) -> str:
        """Create reviewer `name` (an admin when `admin`); returns its token, shown once."""
        with self._db.tx() as conn:
            now, actor = self._begin(conn)
            return add_reviewer_row(self._db, conn, now, actor, name, admin=admin)

    def remove_reviewer(self, name: str) -> int:
        """Revoke `name`: token and sessions stop working, held items go back to pending.
        Returns how many claims were released."""
        db = self._db
        with db.tx() as conn:
            now, actor = self._begin(conn)
            res = conn.execute(update(reviewers).where(reviewers.c.name == name,
                                                       reviewers.c.active).values(active=False))
            if res.rowcount != 1:
                raise QueueError(f"no active reviewer named '{str(name)[:64]}'")
            conn.execute(update(sessions).where(sessions.c.reviewer == name,
                                                sessions.c.revoked_at.is_(None))
                         .values(revoked_at=now))
            released = self._release_rows(conn, items.c.claimed_by == name)
            audit.append(db, conn, now, [
                *({"item_id": i, "actor": actor, "action": "released",
                   "comment": f"reviewer {name} removed"} for i in released),
                {"subject": name, "actor": actor, "action": "reviewer_removed"}])
            return len(released)

    def _release_rows(self, conn: Connection, where) -> list[int]:
        rows = conn.execute(update(items).where(items.c.state == "claimed", where)
                            .values(state="pending", claimed_by=None, lease_expires_at=None)
                            .returning(items.c.id)).all()
        return sorted(r.id for r in rows)

    def release(self, *, item_id: int | None = None, reviewer: str | None = None) -> list[int]:
        """Return claims to pending: one item, or everything `reviewer` holds."""
        if (item_id is None) == (reviewer is None):
            raise InputError("give exactly one of an item id or a reviewer", field="release")
        where = items.c.id == _check_id(item_id) if item_id is not None \
            else items.c.claimed_by == reviewer
        db = self._db
        with db.tx() as conn:
            now, actor = self._begin(conn)
            released = self._release_rows(conn, where)
            audit.append(db, conn, now, [{"item_id": i, "actor": actor, "action": "released",
                                          "comment": "released by an admin"} for i in released])
            return released

    def set_limits(self, **limits: int) -> dict[str, int]:
        """Change the server's lease/claim limits (keys of DEFAULT_LIMITS)."""
        db = self._db
        with db.tx() as conn:
            now, actor = self._begin(conn)
            for key, value in limits.items():
                if key not in DEFAULT_LIMITS:
                    raise InputError(f"unknown limit (one of {sorted(DEFAULT_LIMITS)})", field=key)
                if isinstance(value, bool) or not isinstance(value, int) \
                        or not 1 <= value <= 7 * 86400:
                    raise InputError("must be an integer between 1 and 604800", field=key)
                res = conn.execute(update(review_meta).where(review_meta.c.key == key)
                                   .values(value=str(value)))
                if res.rowcount == 0:
                    conn.execute(review_meta.insert().values(key=key, value=str(value)))
            new = read_limits(conn)
            if new["default_lease_seconds"] > new["max_lease_seconds"]:
                raise InputError("the default lease cannot exceed the maximum lease",
                                 field="default_lease_seconds")
            audit.append(db, conn, now, [{"actor": actor, "action": "limits_set",
                                          "comment": json.dumps(new, sort_keys=True)}])
            return new


def add_reviewer_row(db, conn: Connection, now: float, actor: str, name: str, *,
                     admin: bool) -> str:
    """Insert reviewer `name` with a fresh token and its audit event; returns the token."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InputError(f"reviewer name {str(name)[:70]!r} must be 1-64 of letters, digits, "
                         "'_.@-'", field="name")
    row = conn.execute(select(reviewers.c.id, reviewers.c.active)
                       .where(reviewers.c.name == name)).first()
    if row is not None and row.active:
        raise QueueError(f"reviewer '{name}' already exists")
    token = new_token()
    digest = token_hash(token)
    if row is not None:        # removed earlier: back with a fresh token (the old stays revoked)
        conn.execute(update(reviewers).where(reviewers.c.id == row.id).values(
            token_sha256=digest, active=True, is_admin=admin))
    else:
        conn.execute(reviewers.insert().values(name=name, token_sha256=digest, active=True,
                                               is_admin=admin, created_at=now))
    audit.append(db, conn, now, [{"subject": name, "actor": actor,
                                  "action": "admin_added" if admin else "reviewer_added",
                                  "comment": f"token sha256 {digest}"}])
    return token
