"""Review queue store on SQLite and on a real PostgreSQL server: idempotent enqueue, the
state machine behind reviewer tokens, leases on the database clock, limits, exports, stats,
and 8 processes racing over 500 items."""

from __future__ import annotations

import csv
import io
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from review_fixtures import (claim_worker, expire_leases, gated_item, open_worker,  # noqa: F401
                             pg_schema_url, queue_url, queue_with, sqlite_url)
from sqlalchemy import text

from protdp.errors import InputError
from protdp.paths import REPO_ROOT
from protdp.review.store import (AuthError, ClaimConflict, ItemNotFound, QueueError,
                                 ReviewStore, SCHEMA_VERSION)


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
    assert item["band"] == "low" and item["length"] == 40


def test_enqueue_rejects_bad_input(sqlite_url):
    store = ReviewStore(sqlite_url)
    good = gated_item(1)
    with pytest.raises(InputError, match="prediction_id"):
        store.enqueue(**{**good, "prediction_id": ""})
    with pytest.raises(InputError, match="reasons"):
        store.enqueue(**{**good, "reasons": ["Low Mean!"]})
    with pytest.raises(InputError, match="scores"):
        store.enqueue(**{**good, "scores": {"x": object()}})
    with pytest.raises(InputError, match="band"):
        store.enqueue(**{**good, "scores": {"band": "<b>"}})
    with pytest.raises(InputError, match="actor"):
        store.enqueue(**good, actor="gate\x1b[2J")
    item = store.get(store.enqueue(**{**good, "scores": {"plddt": [float("nan"), 50.0]}}))
    assert item["scores"]["plddt"] == [None, 50.0]  # non-finite values stored as null


def test_the_store_has_no_decision_by_name(queue_url):
    """With only the queue URL nobody can decide as alice: every change needs her token."""
    store, admin, tokens = queue_with(queue_url, "alice")
    store.enqueue(**gated_item(1))
    assert not hasattr(store, "decide") and not hasattr(store, "claim")
    assert not hasattr(store, "add_reviewer") and not hasattr(store, "deactivate_reviewer")
    for bad in ("alice", "", None, tokens["alice"] + "x"):
        with pytest.raises(AuthError):
            store.reviewer(bad)
    with pytest.raises(AuthError, match="not an admin"):
        store.admin(tokens["alice"])
    with pytest.raises(AuthError):
        store.admin("admin")
    with pytest.raises(QueueError, match="already has an admin"):
        store.init_admin("mallory")
    assert store.get(1)["state"] == "pending"
    assert store.reviewer(tokens["alice"]).decide(1, "approve")["decided_by"] == "alice"


def test_claim_decide_state_machine(queue_url):
    store, admin, tokens = queue_with(queue_url, "alice", "bob")
    alice, bob = store.reviewer(tokens["alice"]), store.reviewer(tokens["bob"])
    i1 = store.enqueue(**gated_item(1))
    i2 = store.enqueue(**gated_item(2))
    got = alice.claim(lease_seconds=60)
    assert got["id"] == i1 and got["state"] == "claimed" and got["claimed_by"] == "alice"
    assert 55 < got["lease_remaining_s"] <= 60
    assert alice.claim(lease_seconds=60)["id"] == i2  # claim next skips what alice holds
    assert bob.claim(lease_seconds=60) is None
    with pytest.raises(ClaimConflict, match="claimed by alice"):
        bob.decide(i1, "approve")
    with pytest.raises(ClaimConflict, match="claimed by alice"):
        bob.claim(i1)
    with pytest.raises(InputError, match="comment"):
        alice.decide(i1, "reject", "  ")
    with pytest.raises(InputError, match="action"):
        alice.decide(i1, "delete", "x")
    with pytest.raises(InputError, match="lease"):
        bob.claim(lease_seconds=float("inf"))
    done = alice.decide(i1, "reject", "backbone clashes")
    assert done["state"] == "rejected" and done["decided_by"] == "alice"
    assert done["comment"] == "backbone clashes" and done["claimed_by"] is None
    with pytest.raises(ClaimConflict, match="already rejected by alice"):
        alice.decide(i1, "approve")
    with pytest.raises(ItemNotFound):
        alice.decide(999, "approve")
    for huge in (2**31, 2**63, -1, 0):
        with pytest.raises(ItemNotFound):
            store.get(huge)
        with pytest.raises(ItemNotFound):
            alice.claim(huge)
    assert alice.release(i2)["state"] == "pending"
    # a pending item can be decided directly (claim and decision in one transaction)
    i3 = store.enqueue(**gated_item(3))
    assert bob.decide(i3, "escalate", "needs a crystallographer")["state"] == "escalated"
    assert [e["action"] for e in store.events(i1)] == ["enqueued", "claimed", "rejected"]
    assert [(e["actor"], e["action"], e["comment"]) for e in store.events(i3)] == [
        ("gate", "enqueued", store.events(i3)[0]["comment"]),
        ("bob", "escalated", "needs a crystallographer")]


def test_leases_run_on_the_database_clock(queue_url):
    store, admin, tokens = queue_with(queue_url, "alice", "bob")
    alice, bob = store.reviewer(tokens["alice"]), store.reviewer(tokens["bob"])
    i1 = store.enqueue(**gated_item(1))
    alice.claim(lease_seconds=60)
    assert bob.claim() is None
    expire_leases(store)                                # alice's lease is over
    before = (store.get(i1), len(store.events()))
    assert [i["id"] for i in store.list(state="pending")] == [i1]   # reads as pending ...
    assert store.stats()["by_state"]["pending"] == 1 and store.get(i1)["claimed_by"] is None
    with store.engine.connect() as conn:                             # ... but reads never write
        assert conn.execute(text("SELECT state FROM review_items")).scalar() == "claimed"
    assert len(store.events()) == before[1]
    got = bob.claim()
    assert got["id"] == i1 and got["claimed_by"] == "bob"
    with pytest.raises(ClaimConflict, match="claimed by bob"):
        alice.decide(i1, "approve")
    assert [e["action"] for e in store.events(i1)] == ["enqueued", "claimed", "lease_expired",
                                                       "claimed"]
    # the holder renews; an expired lease of someone else may be decided by anyone
    assert bob.claim(i1, lease_seconds=100)["lease_remaining_s"] > 95
    assert store.events(i1)[-1]["action"] == "renewed"
    expire_leases(store)
    assert alice.decide(i1, "approve")["state"] == "approved"


def test_lease_expires_in_real_time(sqlite_url):
    store, admin, tokens = queue_with(sqlite_url, "alice", "bob")
    i1 = store.enqueue(**gated_item(1))
    store.reviewer(tokens["alice"]).claim(lease_seconds=0.3)
    bob = store.reviewer(tokens["bob"])
    assert bob.claim() is None
    time.sleep(0.4)
    assert bob.claim()["id"] == i1


_SKEWED = """
import sys, time
real = time.time
time.time = lambda: real() + float(sys.argv[3])   # this client's clock is wrong
from protdp.review.store import ReviewStore
store = ReviewStore(sys.argv[1])
rev = store.reviewer(sys.argv[2])
item = rev.claim()
print("none" if item is None else item["id"])
if item is not None:
    print(rev.decide(item["id"], "approve")["decided_at"])
"""


def _skewed_client(url: str, token: str, skew_s: float) -> list[str]:
    res = subprocess.run([sys.executable, "-c", _SKEWED, url, token, str(skew_s)],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_a_client_clock_cannot_steal_a_lease_or_backdate_a_decision(queue_url):
    """A client an hour ahead sees alice's live lease; a decision from a client whose clock
    says 2000-01-01 is stamped with the database's time."""
    store, admin, tokens = queue_with(queue_url, "alice", "bob")
    store.enqueue(**gated_item(1))
    store.reviewer(tokens["alice"]).claim(lease_seconds=600)
    assert _skewed_client(store.url, tokens["bob"], 3600.0) == ["none"]
    store.enqueue(**gated_item(2))
    out = _skewed_client(store.url, tokens["bob"], 946684800.0 - time.time())
    assert out[0] == "2"
    decided_at = float(out[1])
    assert abs(decided_at - time.time()) < 60            # not 2000-01-01
    assert abs(store.events(2)[-1]["at"] - time.time()) < 60


def test_server_limits_bound_leases_and_claims(queue_url):
    store, admin, tokens = queue_with(queue_url, "alice")
    alice = store.reviewer(tokens["alice"])
    for i in range(5):
        store.enqueue(**gated_item(i))
    admin.set_limits(max_lease_seconds=120, default_lease_seconds=60, max_claims_per_reviewer=2)
    got = alice.claim(lease_seconds=24 * 3600)           # a crafted request asks for a day
    assert got["lease_remaining_s"] <= 120
    assert alice.claim()["lease_remaining_s"] <= 60      # the server's default
    with pytest.raises(ClaimConflict, match="already holds 2 items"):
        alice.claim()
    assert alice.claim(got["id"])["id"] == got["id"]     # renewing what you hold is fine
    with pytest.raises(InputError, match="default lease"):
        admin.set_limits(default_lease_seconds=500)
    with pytest.raises(AuthError):
        store.admin(tokens["alice"]).set_limits(max_lease_seconds=10**6)
    assert store.limits()["max_lease_seconds"] == 120


def test_removing_a_reviewer_releases_claims_and_revokes_sessions(queue_url):
    store, admin, tokens = queue_with(queue_url, "alice", "bob")
    for i in range(3):
        store.enqueue(**gated_item(i))
    alice = store.reviewer(tokens["alice"])
    alice.claim()
    alice.claim()
    session, principal = store.login(tokens["alice"])
    assert principal.name == "alice" and store.session(session).name == "alice"
    assert admin.remove_reviewer("alice") == 2
    assert store.session(session) is None
    assert store.list(state="claimed") == [] and len(store.list(state="pending")) == 3
    with pytest.raises(AuthError):
        alice.claim()                                     # the old object is dead too
    with pytest.raises(AuthError):
        store.reviewer(session=session)
    bob = store.reviewer(tokens["bob"])
    assert bob.claim()["id"] == 1
    assert admin.release(reviewer="bob") == [1]
    assert [e["action"] for e in store.events(1)][-1] == "released"
    with pytest.raises(InputError):
        admin.release()
    assert store.verify()["ok"]


def test_logout_ends_the_session_for_every_copy(queue_url):
    store, admin, tokens = queue_with(queue_url, "alice")
    session, _ = store.login(tokens["alice"])
    copy = str(session)
    store.logout(session)
    assert store.session(copy) is None
    expired, _ = store.login(tokens["alice"], session_seconds=-1)
    assert store.session(expired) is None


def test_list_filters_and_sorting(queue_url):
    store, admin, tokens = queue_with(queue_url, "alice")
    store.enqueue(**gated_item(1, target="KRAS_G12C", mean=60))
    store.enqueue(**{**gated_item(2, target="kras-wt", mean=40), "reasons": ["screening"]})
    store.enqueue(**{**gated_item(3, target="p53%_x", mean=50, length=80),
                     "reasons": ["shallow_msa"]})
    store.reviewer(tokens["alice"]).decide(1, "approve")
    assert [i["id"] for i in store.list(state="open")] == [2, 3]
    assert [i["id"] for i in store.list(state="approved")] == [1]
    assert [i["id"] for i in store.list(target="KRAS")] == [1, 2]
    assert [i["id"] for i in store.list(target="%")] == [3]  # LIKE wildcards are literal
    assert [i["id"] for i in store.list(reason="screening")] == [2]
    assert [i["id"] for i in store.list(reason="shallow_msa")] == [1, 3]
    assert store.list(reason="shallow") == [] and store.list(reason="shallow_ms_") == []
    assert [i["id"] for i in store.list(limit=1, offset=1)] == [2]
    assert [i["id"] for i in store.list(sort="mean_plddt")] == [2, 3, 1]
    assert [i["id"] for i in store.list(sort="length", descending=True)] == [3, 1, 2]
    assert store.count("open") == 2 and store.count(target="kras") == 2
    with pytest.raises(InputError, match="state"):
        store.list(state="done")
    with pytest.raises(InputError, match="sort"):
        store.list(sort="token_sha256")


def test_export_has_decisions_with_audit_trail(queue_url):
    store, admin, tokens = queue_with(queue_url, "alice")
    alice = store.reviewer(tokens["alice"])
    i1 = store.enqueue(**gated_item(1, target="=HYPERLINK(\"http://x\")"))
    store.enqueue(**gated_item(2))
    alice.claim(i1)
    alice.decide(i1, "reject", "-1 for the loop")
    records = [json.loads(line) for line in store.export("jsonl").splitlines()]
    assert len(records) == 1  # the pending item is not a decision
    rec = records[0]
    assert rec["decision"] == "rejected" and rec["decided_by"] == "alice"
    assert rec["target"] == "=HYPERLINK(\"http://x\")" and rec["reasons"] == store.get(i1)["reasons"]
    assert rec["msa_depth"] is None and rec["length"] == 40 and rec["band"] == "low"
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
    store, admin, tokens = queue_with(queue_url, "alice")
    alice = store.reviewer(tokens["alice"])
    for i in range(4):
        store.enqueue(**gated_item(i))
    alice.decide(1, "approve")
    alice.decide(2, "escalate", "unsure")
    alice.claim()
    s = store.stats()
    assert s["total"] == 4
    assert s["by_state"] == {"pending": 1, "claimed": 1, "approved": 1, "rejected": 0,
                             "escalated": 1}
    assert s["by_reviewer"] == {"alice": {"approved": 1, "rejected": 0, "escalated": 1}}
    assert 0 <= s["oldest_pending_age_s"] < 60


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
    (tmp_path / "dir.sqlite").mkdir()       # was "no review queue ... create it with init-db",
    for create in (False, True):            # and init-db then "unable to open database file"
        with pytest.raises(InputError, match="dir.sqlite is a directory, not a database file"):
            ReviewStore(str(tmp_path / "dir.sqlite"), create=create)
    with pytest.raises(InputError, match="unsupported"):
        ReviewStore("mysql://u@h/db")


def _race(url: str, tmp_path, n_items: int = 500, n_procs: int = 8) -> None:
    names = [f"rev{k}" for k in range(n_procs)]
    store, admin, tokens = queue_with(url, *names)
    for i in range(n_items):
        store.enqueue(**gated_item(i, length=8))
    ctx = mp.get_context("forkserver")  # one clean import, then cheap forks (no inherited threads)
    ctx.set_forkserver_preload(["review_fixtures"])
    barrier = ctx.Barrier(n_procs)
    outs = [tmp_path / f"worker{k}.json" for k in range(n_procs)]
    procs = [ctx.Process(target=claim_worker, args=(url, tokens[names[k]], barrier, str(outs[k])))
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
        if ev["item_id"] is not None:
            per_item.setdefault(ev["item_id"], []).append(ev["action"])
    assert all(acts == ["enqueued", "claimed", acts[2]] and acts[2] != "claimed"
               for acts in per_item.values()), "an item was claimed or decided twice"
    assert len(per_item) == n_items
    assert len(store.export("jsonl").splitlines()) == n_items
    report = store.verify()
    assert report["ok"], report["problems"]  # the chain stayed linear under concurrency


def test_eight_processes_claim_500_items_sqlite(sqlite_url, tmp_path):
    _race(sqlite_url, tmp_path)


def test_eight_processes_claim_500_items_postgresql(tmp_path):
    with pg_schema_url() as url:
        _race(url, tmp_path)


def test_concurrent_first_opens_of_a_new_sqlite_queue(tmp_path):
    """Prediction ranks open one new SQLite file at once: none may fail with "database is
    locked" (switching a new file to WAL needs an exclusive lock and is not retried by SQLite)."""
    ctx = mp.get_context("forkserver")
    trials, ranks = 40, 6                     # the same 6 processes race on 40 new files
    urls = [f"sqlite:///{tmp_path / f'q{trial}.sqlite'}" for trial in range(trials)]
    outs = [[str(tmp_path / f"open{trial}_{k}.txt") for trial in range(trials)]
            for k in range(ranks)]
    barrier = ctx.Barrier(ranks)
    procs = [ctx.Process(target=open_worker, args=(urls, barrier, o)) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    failures = [Path(o).read_text() for rank in outs for o in rank
                if Path(o).read_text() != "ok"]
    assert failures == [], f"{len(failures)} of {trials * ranks} opens failed: {failures[:2]}"
