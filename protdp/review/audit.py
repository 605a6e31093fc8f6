"""The audit log: append-only and hash-chained, so edits and truncation are detectable.

Every state change appends events in the same transaction as the change. Event `seq` runs
1, 2, 3, ... with no gaps; `hash = SHA-256(prev_hash | canonical JSON of the event)` and the
first event chains to `GENESIS_HASH`. Appends are serialised (PostgreSQL advisory lock, taken
last so it never waits while holding it; SQLite's single writer), so the chain is linear.

`verify` recomputes the chain, then replays it: each item's state, holder, decider, comment and
lease (never past what its claim event granted), each reviewer's active/admin flags and token
hash, and each open web session's reviewer must be what their events say, and each
row's `last_event_seq` must exist. So editing a rejection into an approval, forging a reviewer,
rewriting or deleting events, or truncating the log are all reported; a head recorded elsewhere
(`expect_head`, "SEQ:HASH") also catches a rewrite of the whole chain from that point on.
On PostgreSQL `protdp review init-db` additionally denies the application role UPDATE/DELETE/
TRUNCATE on the log, and triggers refuse them for every role.

Keyed (v3): the chain itself is public arithmetic, so every event except the predictor's
`enqueued`/`superseded` also carries `mac = HMAC(server key, hash)` (`protdp.review.keys`); an
event inserted by anyone holding only a database credential has no valid mac and `verify`
names it, and an unsigned event can only ever make an item pending. A decision event carries
`bound_sha256`, the item's content digest (its scores, paths and the sha256 of every file at
enqueue) at the moment of the decision; `verify` checks it equals the enqueue digest, and export
re-hashes the files against it (`protdp.review.binding`). So the recorded file digests are
covered by the keyed chain; `ReviewStore.verify` then re-hashes the files themselves
(`protdp.review.rehash`).
"""

from __future__ import annotations

import hashlib
import json
import re

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from protdp.review import keys
from protdp.review.errors import QueueError
from protdp.review.schema import ACTIONS, GENESIS_HASH, events, items, reviewers, sessions

MAX_PROBLEMS = 50
_DECISIONS = set(ACTIONS.values())
UNSIGNED_ACTIONS = ("enqueued", "superseded")   # the predictor's, which holds no key
_LEASE_RE = re.compile(r"lease ([0-9.e+]+) s ")
LEASE_SLACK_S = 1.0                             # the claim event's lease is printed with %g


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def content_digest(row: dict) -> str:
    """SHA-256 of what the gate sent for review (recorded in the `enqueued` event)."""
    names = ("prediction_id", "target", "reasons", "details", "scores", "folder", "paths")
    body = {k: row[k] for k in names}
    if row.get("file_sha256") is not None:      # v3 items: the bytes of every file too
        body["file_sha256"] = row["file_sha256"]
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def event_hash(prev_hash: str, ev: dict) -> str:
    fields = [ev["seq"], ev["item_id"], ev["subject"], ev["at"], ev["actor"], ev["action"],
              ev["comment"]]
    if ev.get("bound_sha256") is not None:
        fields.append(ev["bound_sha256"])
    body = canonical(fields)
    return hashlib.sha256(f"{prev_hash}|{body}".encode()).hexdigest()


def append(db, conn: Connection, at: float, entries: list[dict]) -> None:
    """Append events (dicts with actor, action and optional item_id, subject, comment, at) at
    database time `at`; call after every row lock of the transaction is taken."""
    if not entries:
        return
    key = conn.info.get("review_key")
    if key is None and any(e["action"] not in UNSIGNED_ACTIONS for e in entries):
        raise QueueError(f"this needs the queue's audit key ({db.key_path}), which this "
                         f"process cannot read; run it where the review server runs, or set "
                         f"{keys.KEY_ENV}")
    db.chain_lock(conn)
    head = conn.execute(select(events.c.seq, events.c.hash)
                        .order_by(events.c.seq.desc()).limit(1)).first()
    seq, prev = (head.seq, head.hash) if head else (0, GENESIS_HASH)
    rows, last_item, last_subject = [], {}, {}
    for e in entries:
        seq += 1
        ev = {"seq": seq, "item_id": e.get("item_id"), "subject": e.get("subject"),
              "at": float(e.get("at", at)),
              "actor": e["actor"], "action": e["action"], "comment": e.get("comment"),
              "bound_sha256": e.get("bound_sha256")}
        ev["prev_hash"], ev["hash"] = prev, event_hash(prev, ev)
        ev["mac"] = keys.mac(key, ev["hash"]) if key is not None else None
        prev = ev["hash"]
        rows.append(ev)
        if ev["item_id"] is not None:
            last_item[ev["item_id"]] = seq
        if ev["subject"] is not None:
            last_subject[ev["subject"]] = seq
    conn.execute(events.insert(), rows)
    for item_id, s in last_item.items():
        conn.execute(update(items).where(items.c.id == item_id).values(last_event_seq=s))
    for name, s in last_subject.items():
        conn.execute(update(reviewers).where(reviewers.c.name == name).values(last_event_seq=s))


def _replay_item(state: dict, ev) -> str | None:
    """Apply one event to an item's replayed state; returns a problem text or None."""
    act = ev.action
    if act == "enqueued":
        state.update(state="pending", claimed_by=None, decided_by=None, comment=None,
                     superseded_by=None,
                     digest=(ev.comment or "")[7:] if (ev.comment or "").startswith("sha256 ")
                     else None)
    elif "state" not in state:
        return f"event {ev.seq}: item {ev.item_id} has '{act}' before 'enqueued'"
    elif act in ("claimed", "renewed"):
        lease = _LEASE_RE.match(ev.comment or "")
        state.update(state="claimed", claimed_by=ev.actor,
                     lease_until=ev.at + float(lease.group(1)) if lease else None)
    elif act in ("lease_expired", "released"):
        state.update(state="pending", claimed_by=None)
    elif act == "superseded":
        newer = (ev.comment or "").removeprefix("by item ")
        state["superseded_by"] = int(newer) if newer.isdigit() else newer
    elif act in _DECISIONS:
        state.update(state=act, claimed_by=None, decided_by=ev.actor, comment=ev.comment)
        if state.get("digest") and ev.bound_sha256 is not None \
                and ev.bound_sha256 != state["digest"]:
            state["last"] = ev.seq
            return (f"event {ev.seq}: the {act} decision of item {ev.item_id} does not bind the "
                    "item's enqueued content (files or scores changed before the decision?)")
    else:
        return f"event {ev.seq}: unknown action '{act}'"
    state["last"] = ev.seq
    return None


def _replay_reviewer(state: dict, ev) -> str | None:
    if ev.action in ("reviewer_added", "admin_added"):
        token = (ev.comment or "").removeprefix("token sha256 ")
        state.update(active=True, is_admin=ev.action == "admin_added", token=token)
    elif ev.action == "reviewer_removed":
        state["active"] = False
    else:
        return f"event {ev.seq}: unknown reviewer action '{ev.action}'"
    state["last"] = ev.seq
    return None


def _walk_chain(conn: Connection, problems: list[str]):
    """Recompute the chain; returns (count, head hash, item states, reviewer states)."""
    expected_seq, prev = 1, GENESIS_HASH
    key = conn.info.get("review_key")
    if key is None:
        problems.append("the audit key is not readable here, so signatures cannot be checked "
                        f"(set {keys.KEY_ENV})")
    item_state: dict[int, dict] = {}
    reviewer_state: dict[str, dict] = {}
    for ev in conn.execute(select(events).order_by(events.c.seq)).yield_per(2000):
        if ev.seq != expected_seq:
            problems.append(f"events {expected_seq}..{ev.seq - 1} are missing (deleted?)")
        row = {"seq": ev.seq, "item_id": ev.item_id, "subject": ev.subject, "at": ev.at,
               "actor": ev.actor, "action": ev.action, "comment": ev.comment,
               "bound_sha256": ev.bound_sha256}
        if key is not None and not keys.same(ev.mac, keys.mac(key, ev.hash)) and (
                ev.mac is not None or ev.action not in UNSIGNED_ACTIONS):
            about = f" on item {ev.item_id}" if ev.item_id is not None else ""
            problems.append(f"event {ev.seq}: '{ev.action}'{about} by {ev.actor!r} is not signed "
                            "by the server's audit key (forged with a database credential?)")
        if ev.prev_hash != prev:
            problems.append(f"event {ev.seq}: prev_hash does not match event {ev.seq - 1}")
        if event_hash(ev.prev_hash, row) != ev.hash:
            problems.append(f"event {ev.seq}: content does not match its hash (edited)")
        prev, expected_seq = ev.hash, ev.seq + 1
        problem = None
        if ev.item_id is not None:
            problem = _replay_item(item_state.setdefault(ev.item_id, {}), ev)
        elif ev.subject is not None:
            problem = _replay_reviewer(reviewer_state.setdefault(ev.subject, {}), ev)
        if problem:
            problems.append(problem)
    return expected_seq - 1, prev, item_state, reviewer_state


def _check_items(conn: Connection, replayed: dict[int, dict], problems: list[str]) -> None:
    seen = set()
    for row in conn.execute(select(items)).mappings().yield_per(2000):
        seen.add(row["id"])
        want = replayed.get(row["id"])
        if want is None or "state" not in want:
            problems.append(f"item {row['id']} has no 'enqueued' event")
            continue
        for key in ("state", "claimed_by", "decided_by", "comment", "superseded_by"):
            if row[key] != want.get(key):
                problems.append(f"item {row['id']}: {key} is {row[key]!r} but the audit log "
                                f"says {want.get(key)!r}")
        until = want.get("lease_until")
        if row["state"] == "claimed" and until is not None and row["lease_expires_at"] \
                is not None and row["lease_expires_at"] > until + LEASE_SLACK_S:
            problems.append(f"item {row['id']}: lease runs {row['lease_expires_at'] - until:.0f}"
                            " s past what its last claim event granted (extended behind the "
                            "log's back)")
        if row["last_event_seq"] != want["last"]:
            problems.append(f"item {row['id']}: last event is {row['last_event_seq']} but the "
                            f"log ends at {want['last']} for it (log truncated?)")
        if want.get("digest") and content_digest(row) != want["digest"]:
            problems.append(f"item {row['id']}: scores, target or files were edited after "
                            "enqueue")
    for item_id in sorted(set(replayed) - seen):
        problems.append(f"item {item_id} is in the audit log but not in the items table")


def _check_reviewers(conn: Connection, replayed: dict[str, dict], problems: list[str]) -> None:
    seen = set()
    for row in conn.execute(select(reviewers)).mappings():
        seen.add(row["name"])
        want = replayed.get(row["name"])
        if want is None or "active" not in want:
            problems.append(f"reviewer {row['name']!r} has no audit event (added behind the "
                            "queue's back?)")
            continue
        got = {"active": bool(row["active"]), "is_admin": bool(row["is_admin"]),
               "token": row["token_sha256"]}
        for key, value in got.items():
            if value != want[key]:
                problems.append(f"reviewer {row['name']!r}: {key} differs from the audit log")
        if row["last_event_seq"] != want["last"]:
            problems.append(f"reviewer {row['name']!r}: last event is {row['last_event_seq']} "
                            f"but the log ends at {want['last']} for it (log truncated?)")


def _check_sessions(conn: Connection, replayed: dict[str, dict], problems: list[str]) -> None:
    """A live session must belong to a reviewer its signed events say is active."""
    live = conn.execute(select(sessions.c.id, sessions.c.reviewer).where(
        sessions.c.revoked_at.is_(None))).all()
    for sid, name in live:
        if not (replayed.get(name) or {}).get("active"):
            problems.append(f"session {sid} is open for {name!r}, who is not an active reviewer "
                            "in the audit log (written behind the server's back?)")


def verify(conn: Connection, expect_head: str | None = None) -> dict:
    """{'ok', 'events', 'head': 'SEQ:HASH', 'problems': [...]} for the whole queue."""
    problems: list[str] = []
    count, head, item_state, reviewer_state = _walk_chain(conn, problems)
    _check_items(conn, item_state, problems)
    _check_reviewers(conn, reviewer_state, problems)
    _check_sessions(conn, reviewer_state, problems)
    if expect_head:
        seq_text, _, want_hash = expect_head.partition(":")
        got = conn.execute(select(events.c.hash).where(events.c.seq == int(seq_text))).scalar() \
            if seq_text.isdigit() and int(seq_text) < 2**31 else None
        if got != want_hash:
            problems.append(f"recorded head {expect_head} is not in the log "
                            f"(found {got!r}: the log was rewritten or truncated)")
    named = [re.findall(r"\bitem (\d+)", p) for p in problems]
    return {"ok": not problems, "events": count, "head": f"{count}:{head}",
            # items a problem names, and whether some problem names none (the whole log)
            "bad_items": sorted({int(i) for ids in named for i in ids}),
            "whole_log_suspect": any(not ids for ids in named),
            "problems": problems[:MAX_PROBLEMS],
            "more_problems": max(0, len(problems) - MAX_PROBLEMS)}
