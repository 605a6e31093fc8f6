"""Review queue store on SQLite and on a real PostgreSQL server: idempotent enqueue, state
machine, leases, append-only audit log, exports, and 8 processes racing over 500 items."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import multiprocessing as mp
import time

import pytest
from review_fixtures import claim_worker, gated_item, open_worker, pg_schema_url, queue_url, sqlite_url  # noqa: F401
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from protdp.errors import InputError
from protdp.review.store import (ClaimConflict, ItemNotFound, QueueError, ReviewStore,
                                 SCHEMA_VERSION)


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_enqueue_is_idempotent(queue_url):
    store = ReviewStore(queue_url)
    a = store.enqueue(**gated_item(1))
    again = gated_item(1)
    again["target"] = "renamed"
    assert store.enqueue(**again) == a
    b = store.enqueue(**gated_item(2))
    assert b != a
    assert [i["target"] for i in store.list()] == ["target1", "target2"]
    assert [e["action"] for e in store.events(a)] == ["enqueued"]
    item = store.get(a)
    assert item["state"] == "pending" and item["reasons"] == gated_item(1)["reasons"]
    assert len(item["scores"]["plddt"]) == 40 and item["mean_plddt"] == pytest.approx(55.0)


def test_enqueue_rejects_bad_input(sqlite_url):
    store = ReviewStore(sqlite_url)
    good = gated_item(1)
    with pytest.raises(InputError, match="prediction_id"):
        store.enqueue(**{**good, "prediction_id": ""})
    with pytest.raises(InputError, match="reasons"):
        store.enqueue(**{**good, "reasons": ["Low Mean!"]})
    with pytest.raises(InputError, match="scores"):
        store.enqueue(**{**good, "scores": {"x": object()}})
    item = store.get(store.enqueue(**{**good, "scores": {"plddt": [float("nan"), 50.0]}}))
    assert item["scores"]["plddt"] == [None, 50.0]  # non-finite values stored as null


def test_claim_decide_state_machine(queue_url):
    store = ReviewStore(queue_url)
    store.add_reviewer("alice")
    store.add_reviewer("bob")
    i1 = store.enqueue(**gated_item(1))
    i2 = store.enqueue(**gated_item(2))
    got = store.claim("alice", 60)
    assert got["id"] == i1 and got["state"] == "claimed" and got["claimed_by"] == "alice"
    assert store.claim("alice", 60)["id"] == i2  # next claim skips what alice holds
    assert store.claim("bob", 60) is None
    with pytest.raises(ClaimConflict, match="claimed by alice"):
        store.decide(i1, "bob", "approve")
    with pytest.raises(ClaimConflict, match="claimed by alice"):
        store.claim("bob", 60, item_id=i1)
    with pytest.raises(InputError, match="comment"):
        store.decide(i1, "alice", "reject", "  ")
    with pytest.raises(InputError, match="lease"):
        store.claim("bob", 10 * 24 * 3600)
    with pytest.raises(InputError, match="action"):
        store.decide(i1, "alice", "delete", "x")
    with pytest.raises(QueueError, match="not an active reviewer"):
        store.decide(i1, "mallory", "approve")
    done = store.decide(i1, "alice", "reject", "backbone clashes")
    assert done["state"] == "rejected" and done["decided_by"] == "alice"
    assert done["comment"] == "backbone clashes" and done["claimed_by"] is None
    with pytest.raises(ClaimConflict, match="already rejected by alice"):
        store.decide(i1, "alice", "approve")
    with pytest.raises(ItemNotFound):
        store.decide(999, "alice", "approve")
    # a pending item can be decided directly (claim and decision in one transaction)
    i3 = store.enqueue(**gated_item(3))
    assert store.decide(i3, "bob", "escalate", "needs a crystallographer")["state"] == "escalated"
    assert [e["action"] for e in store.events(i1)] == ["enqueued", "claimed", "rejected"]
    assert [(e["actor"], e["action"], e["comment"]) for e in store.events(i3)] == [
        ("gate", "enqueued", None), ("bob", "escalated", "needs a crystallographer")]


def test_lease_expiry_returns_item_to_pending(queue_url):
    clock = Clock()
    store = ReviewStore(queue_url, clock=clock)
    store.add_reviewer("alice")
    store.add_reviewer("bob")
    i1 = store.enqueue(**gated_item(1))
    store.claim("alice", 60)
    clock.t += 59
    assert store.claim("bob", 60) is None
    assert store.list(state="claimed")[0]["id"] == i1
    clock.t += 2  # alice's lease is over
    got = store.claim("bob", 60)
    assert got["id"] == i1 and got["claimed_by"] == "bob"
    with pytest.raises(ClaimConflict, match="claimed by bob"):
        store.decide(i1, "alice", "approve")
    assert [e["action"] for e in store.events(i1)] == ["enqueued", "claimed", "lease_expired",
                                                       "claimed"]
    # the sweep (run by list/stats) returns expired claims to pending
    clock.t += 61
    assert [i["id"] for i in store.list(state="pending")] == [i1]
    assert store.get(i1)["claimed_by"] is None and store.stats()["by_state"]["pending"] == 1
    # a holder renews its own lease; the original holder may still decide an expired but
    # unclaimed item
    store.claim("alice", 10, item_id=i1)
    store.claim("alice", 100, item_id=i1)
    clock.t += 50
    assert store.claim("bob", 60) is None
    clock.t += 100
    assert store.decide(i1, "alice", "approve")["state"] == "approved"


def test_lease_expires_in_real_time(sqlite_url):
    store = ReviewStore(sqlite_url)
    store.add_reviewer("alice")
    store.add_reviewer("bob")
    i1 = store.enqueue(**gated_item(1))
    store.claim("alice", 0.3)
    assert store.claim("bob", 60) is None
    time.sleep(0.4)
    assert store.claim("bob", 60)["id"] == i1


def test_list_filters(queue_url):
    store = ReviewStore(queue_url)
    store.add_reviewer("alice")
    store.enqueue(**gated_item(1, target="KRAS_G12C"))
    store.enqueue(**{**gated_item(2, target="kras-wt"), "reasons": ["screening"]})
    store.enqueue(**{**gated_item(3, target="p53%_x"), "reasons": ["shallow_msa"]})
    store.decide(1, "alice", "approve")
    assert [i["id"] for i in store.list(state="open")] == [2, 3]
    assert [i["id"] for i in store.list(state="approved")] == [1]
    assert [i["id"] for i in store.list(target="KRAS")] == [1, 2]
    assert [i["id"] for i in store.list(target="%")] == [3]  # LIKE wildcards are literal
    assert [i["id"] for i in store.list(reason="screening")] == [2]
    assert [i["id"] for i in store.list(reason="shallow_msa")] == [1, 3]
    assert store.list(reason="shallow") == [] and store.list(reason="shallow_ms_") == []
    assert [i["id"] for i in store.list(limit=1, offset=1)] == [2]
    with pytest.raises(InputError, match="state"):
        store.list(state="done")


def test_event_log_is_append_only(queue_url):
    store = ReviewStore(queue_url)
    store.enqueue(**gated_item(1))
    for stmt in ("UPDATE review_events SET actor = 'mallory'", "DELETE FROM review_events"):
        with pytest.raises(DBAPIError, match="append-only"):
            with store.engine.begin() as conn:
                conn.execute(text(stmt))
    assert [e["actor"] for e in store.events()] == ["gate"]


def test_reviewer_tokens_are_stored_hashed(queue_url):
    store = ReviewStore(queue_url)
    token = store.add_reviewer("alice")
    assert store.authenticate(token) == "alice"
    assert store.authenticate(token + "x") is None and store.authenticate("") is None
    with store.engine.connect() as conn:
        stored = conn.execute(text("SELECT token_sha256 FROM reviewers")).scalar_one()
    assert stored == hashlib.sha256(token.encode()).hexdigest() and token not in stored
    with pytest.raises(QueueError, match="already exists"):
        store.add_reviewer("alice")
    with pytest.raises(InputError, match="name"):
        store.add_reviewer("<script>")
    store.deactivate_reviewer("alice")
    assert store.authenticate(token) is None
    store.enqueue(**gated_item(1))
    with pytest.raises(QueueError, match="not an active reviewer"):
        store.claim("alice")


def test_export_has_decisions_with_audit_trail(queue_url):
    store = ReviewStore(queue_url)
    store.add_reviewer("alice")
    i1 = store.enqueue(**gated_item(1, target="=HYPERLINK(\"http://x\")"))
    store.enqueue(**gated_item(2))
    store.claim("alice", 60, item_id=i1)
    store.decide(i1, "alice", "reject", "-1 for the loop")
    records = [json.loads(line) for line in store.export("jsonl").splitlines()]
    assert len(records) == 1  # the pending item is not a decision
    rec = records[0]
    assert rec["decision"] == "rejected" and rec["decided_by"] == "alice"
    assert rec["target"] == "=HYPERLINK(\"http://x\")" and rec["reasons"] == store.get(i1)["reasons"]
    assert [e["action"] for e in rec["events"]] == ["enqueued", "claimed", "rejected"]
    assert rec["events"][-1]["comment"] == "-1 for the loop"
    rows = list(csv.DictReader(io.StringIO(store.export("csv"))))
    assert len(rows) == 1 and rows[0]["decision"] == "rejected"
    assert rows[0]["target"].startswith("'=")  # spreadsheet formula neutralised
    assert rows[0]["comment"] == "'-1 for the loop"
    assert [e["action"] for e in json.loads(rows[0]["audit_trail"])] == [
        "enqueued", "claimed", "rejected"]
    with pytest.raises(InputError, match="format"):
        store.export("xml")


def test_stats(queue_url):
    clock = Clock()
    store = ReviewStore(queue_url, clock=clock)
    store.add_reviewer("alice")
    for i in range(4):
        store.enqueue(**gated_item(i))
    clock.t += 30
    store.decide(1, "alice", "approve")
    store.decide(2, "alice", "escalate", "unsure")
    store.claim("alice", 60)
    s = store.stats()
    assert s["total"] == 4
    assert s["by_state"] == {"pending": 1, "claimed": 1, "approved": 1, "rejected": 0,
                             "escalated": 1}
    assert s["by_reviewer"] == {"alice": {"approved": 1, "rejected": 0, "escalated": 1}}
    assert s["oldest_pending_age_s"] == pytest.approx(30.0)


def test_schema_is_created_once_and_versioned(queue_url):
    store = ReviewStore(queue_url)
    store.enqueue(**gated_item(1))
    assert ReviewStore(queue_url).get(1)["prediction_id"] == "run1/target1"  # reopen: no re-create
    if store.dialect == "sqlite":
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE review_meta SET value = :v WHERE key = 'schema_version'"),
                     {"v": str(SCHEMA_VERSION + 1)})
    with pytest.raises(QueueError, match="schema version"):
        ReviewStore(queue_url)


def test_bad_urls_give_clear_errors(tmp_path):
    with pytest.raises(QueueError, match="cannot open review queue .*127.0.0.1:1"):
        ReviewStore("postgresql://u:secret@127.0.0.1:1/db")
    with pytest.raises(InputError, match="does not exist"):
        ReviewStore(str(tmp_path / "missing" / "q.sqlite"))
    with pytest.raises(InputError, match="unsupported"):
        ReviewStore("mysql://u@h/db")


def _race(url: str, tmp_path, n_items: int = 500, n_procs: int = 8) -> None:
    store = ReviewStore(url)
    names = [f"rev{k}" for k in range(n_procs)]
    for name in names:
        store.add_reviewer(name)
    for i in range(n_items):
        store.enqueue(**gated_item(i, length=8))
    ctx = mp.get_context("forkserver")  # one clean import, then cheap forks (no inherited threads)
    ctx.set_forkserver_preload(["review_fixtures"])
    barrier = ctx.Barrier(n_procs)
    outs = [tmp_path / f"worker{k}.json" for k in range(n_procs)]
    procs = [ctx.Process(target=claim_worker, args=(url, names[k], barrier, str(outs[k])))
             for k in range(n_procs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    results = [json.loads(o.read_text()) for o in outs]
    assert [r["errors"] for r in results] == [[]] * n_procs
    claimed = [i for r in results for i in r["claimed"]]
    assert len(claimed) == n_items and len(set(claimed)) == n_items  # no loss, no double claim
    assert sum(1 for r in results if r["claimed"]) >= 2  # the race really happened
    owner = {i: names[k] for k, r in enumerate(results) for i in r["claimed"]}
    decided = store.list(limit=n_items + 1)
    assert len(decided) == n_items
    for item in decided:
        assert item["state"] == ("approved", "rejected", "escalated")[item["id"] % 3]
        assert item["decided_by"] == owner[item["id"]]
    per_item: dict[int, list[str]] = {}
    for ev in store.events():
        per_item.setdefault(ev["item_id"], []).append(ev["action"])
    assert all(acts == ["enqueued", "claimed", acts[2]] and acts[2] != "claimed"
               for acts in per_item.values()), "an item was claimed or decided twice"
    assert len(per_item) == n_items
    assert len(store.export("jsonl").splitlines()) == n_items


def test_eight_processes_claim_500_items_sqlite(sqlite_url, tmp_path):
    _race(sqlite_url, tmp_path)


def test_eight_processes_claim_500_items_postgresql(tmp_path):
    with pg_schema_url() as url:
        _race(url, tmp_path)


def test_concurrent_first_opens_of_a_new_sqlite_queue(tmp_path):
    """Prediction ranks open one new SQLite file at once: none may fail with "database is
    locked" (switching a new file to WAL needs an exclusive lock and is not retried by SQLite)."""
    ctx = mp.get_context("forkserver")
    failures = []
    for trial in range(8):
        url = f"sqlite:///{tmp_path / f'q{trial}.sqlite'}"
        barrier = ctx.Barrier(6)
        outs = [tmp_path / f"open{trial}_{k}.txt" for k in range(6)]
        procs = [ctx.Process(target=open_worker, args=(url, barrier, str(o))) for o in outs]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        failures += [o.read_text() for o in outs if o.read_text() != "ok"]
    assert failures == []
