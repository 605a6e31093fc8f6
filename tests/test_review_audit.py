"""The audit log cannot be quietly changed: append-only triggers (TRUNCATE included on
PostgreSQL), application-role grants set by `protdp review init-db`, and a hash chain that
`verify` recomputes and replays against the items and reviewers tables."""

from __future__ import annotations

import uuid

import pytest
from review_fixtures import gated_item, pg_schema_url, queue_url, queue_with, sqlite_url  # noqa: F401
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from protdp.review.store import ReviewStore


def _decided_queue(url):
    store, admin, tokens = queue_with(url, "alice", "bob")
    alice = store.reviewer(tokens["alice"])
    for i in range(4):
        store.enqueue(**gated_item(i))
    alice.claim(1)
    alice.decide(1, "reject", "backbone clashes")
    alice.decide(2, "approve")
    alice.claim(3)
    return store, admin, tokens


def _sql(store, *statements):
    with store.engine.begin() as conn:
        for stmt in statements:
            conn.execute(text(stmt))


def test_event_log_refuses_update_delete_and_truncate(queue_url):
    store, _, _ = _decided_queue(queue_url)
    statements = ["UPDATE review_events SET actor = 'mallory'", "DELETE FROM review_events"]
    if store.dialect == "postgresql":
        statements.append("TRUNCATE review_events CASCADE")  # row triggers never see this one
    for stmt in statements:
        with pytest.raises(DBAPIError, match="append-only"):
            _sql(store, stmt)
    assert store.verify()["ok"]


def test_verify_passes_on_an_honest_queue_and_names_its_head(queue_url):
    store, admin, tokens = _decided_queue(queue_url)
    report = store.verify()
    assert report["ok"] and report["problems"] == []
    n = len(store.events())
    assert report["events"] == n and report["head"].startswith(f"{n}:")
    assert store.verify(expect_head=report["head"])["ok"]
    admin.remove_reviewer("bob")
    assert store.verify(expect_head=report["head"])["ok"]  # appending keeps the old head


def test_verify_detects_a_rejection_edited_into_an_approval(queue_url):
    store, _, _ = _decided_queue(queue_url)
    _sql(store, "UPDATE review_items SET state = 'approved', comment = NULL WHERE id = 1")
    report = store.verify()
    assert not report["ok"]
    assert any("item 1: state is 'approved' but the audit log says 'rejected'" in p
               for p in report["problems"])


def test_verify_detects_edited_scores_and_forged_reviewers(queue_url):
    store, _, _ = _decided_queue(queue_url)
    _sql(store, "UPDATE review_items SET target = 'innocent' WHERE id = 4",
         "UPDATE reviewers SET active = true WHERE name = 'alice'",
         "UPDATE reviewers SET is_admin = true WHERE name = 'bob'")
    _sql(store, "INSERT INTO reviewers (name, token_sha256, active, is_admin, created_at) "
                "VALUES ('mallory', 'x', true, true, 0)")
    problems = "\n".join(store.verify()["problems"])
    assert "item 4: scores, target or files were edited" in problems
    assert "reviewer 'bob': is_admin differs" in problems
    assert "reviewer 'mallory' has no audit event" in problems


def _drop_triggers(store):
    if store.dialect == "sqlite":
        _sql(store, "DROP TRIGGER review_events_no_update", "DROP TRIGGER review_events_no_delete")
    else:
        _sql(store, "DROP TRIGGER review_events_append_only ON review_events",
             "DROP TRIGGER review_events_no_truncate ON review_events")


def test_verify_detects_edited_deleted_and_truncated_events(queue_url):
    """An owner who drops the triggers can change the log, but not unseen."""
    store, _, _ = _decided_queue(queue_url)
    head = store.verify()["head"]
    _drop_triggers(store)
    _sql(store, "UPDATE review_events SET comment = 'looks fine' WHERE action = 'rejected'")
    assert any("content does not match its hash" in p for p in store.verify()["problems"])
    _sql(store, "DELETE FROM review_events WHERE seq = 3")
    assert any("missing" in p for p in store.verify()["problems"])
    last = max(e["seq"] for e in store.events())
    _sql(store, f"DELETE FROM review_events WHERE seq >= {last - 1}")  # cut the tail
    problems = "\n".join(store.verify(expect_head=head)["problems"])
    assert "log truncated?" in problems and f"recorded head {head} is not in the log" in problems
    if store.dialect == "postgresql":
        _sql(store, "TRUNCATE review_events")
    else:
        _sql(store, "DELETE FROM review_events")
    problems = "\n".join(store.verify()["problems"])
    assert "item 1 has no 'enqueued' event" in problems
    assert "reviewer 'alice' has no audit event" in problems


def _role_url(base_url: str, role: str, password: str) -> str:
    return make_url(base_url).set(username=role, password=password).render_as_string(
        hide_password=False)


def test_init_db_grants_keep_the_app_role_off_the_audit_log():
    """On PostgreSQL the application role may append to the log but not rewrite or empty it,
    even with the triggers gone; the enqueue role may only enqueue."""
    with pg_schema_url() as owner_url:
        owner = ReviewStore(owner_url)
        app_role, enq_role = f"protdp_app_{uuid.uuid4().hex[:8]}", f"protdp_enq_{uuid.uuid4().hex[:8]}"
        _sql(owner, f"CREATE ROLE {app_role} LOGIN PASSWORD 'pw'",
             f"CREATE ROLE {enq_role} LOGIN PASSWORD 'pw'")
        try:
            owner.grant_role(app_role, "app")
            owner.grant_role(enq_role, "enqueue")
            admin = owner.admin(owner.init_admin())
            token = admin.add_reviewer("alice")
            _drop_triggers(owner)                 # grants alone must hold
            app = ReviewStore(_role_url(owner_url, app_role, "pw"))
            app.enqueue(**gated_item(1))
            app.reviewer(token).decide(1, "approve")          # the normal path works
            for stmt in ("UPDATE review_events SET actor = 'x'", "DELETE FROM review_events",
                         "TRUNCATE review_events", "DELETE FROM review_items"):
                with pytest.raises(DBAPIError, match="permission denied"):
                    _sql(app, stmt)
            enq = ReviewStore(_role_url(owner_url, enq_role, "pw"))
            enq.enqueue(**gated_item(2))
            with pytest.raises(Exception, match="permission denied"):
                enq.reviewer(token).decide(2, "approve")
            with pytest.raises(DBAPIError, match="permission denied"):
                _sql(enq, "UPDATE review_items SET state = 'approved'")
            assert owner.verify()["ok"]
            app.close()
            enq.close()
        finally:
            owner.close()
            admin_engine = create_engine(make_url(owner_url).set(drivername="postgresql+psycopg2", query={}))
            with admin_engine.begin() as conn:
                for role in (app_role, enq_role):
                    conn.execute(text(f"DROP OWNED BY {role}"))
                    conn.execute(text(f"DROP ROLE {role}"))
            admin_engine.dispose()


V1_DDL = [
    "CREATE TABLE review_meta (key VARCHAR(64) PRIMARY KEY, value VARCHAR(255) NOT NULL)",
    "CREATE TABLE reviewers (id INTEGER PRIMARY KEY, name VARCHAR(64) NOT NULL UNIQUE, "
    "token_sha256 VARCHAR(64) NOT NULL UNIQUE, active BOOLEAN NOT NULL, created_at FLOAT NOT NULL)",
    "CREATE TABLE review_items (id INTEGER PRIMARY KEY, prediction_id VARCHAR(500) NOT NULL "
    "UNIQUE, target TEXT NOT NULL, state VARCHAR(16) NOT NULL, reasons JSON NOT NULL, "
    "reason_codes TEXT NOT NULL, details JSON NOT NULL, scores JSON NOT NULL, paths JSON NOT NULL, "
    "mean_plddt FLOAT, created_at FLOAT NOT NULL, claimed_by VARCHAR(64), lease_expires_at FLOAT, "
    "decided_by VARCHAR(64), decided_at FLOAT, comment TEXT)",
    "CREATE TABLE review_events (id INTEGER PRIMARY KEY, item_id INTEGER NOT NULL REFERENCES "
    "review_items (id), at FLOAT NOT NULL, actor VARCHAR(64) NOT NULL, action VARCHAR(32) NOT NULL, "
    "comment TEXT)",
    "CREATE TRIGGER review_events_no_delete BEFORE DELETE ON review_events "
    "BEGIN SELECT RAISE(ABORT, 'review_events is append-only'); END",
    "INSERT INTO review_meta VALUES ('schema_version', '1')",
    "INSERT INTO reviewers VALUES (1, 'alice', 'aa', 1, 100.0)",
    "INSERT INTO review_items VALUES (1, 'run/a', 'a', 'rejected', '[\"low_mean_plddt\"]', "
    "',low_mean_plddt,', '{}', '{\"mean_plddt\": 40.0, \"plddt\": [40.0, 40.0]}', "
    "'{\"pdb\": \"/preds/a/a.pdb\", \"cif\": \"/preds/a/a.cif\"}', 40.0, 1.0, NULL, NULL, "
    "'alice', 3.0, 'bad')",
    "INSERT INTO review_items VALUES (2, 'run/b', 'b', 'pending', '[]', ',,', '{}', '{}', "
    "'{\"pdb\": \"/x/b.pdb\", \"cif\": \"/y/b.cif\"}', NULL, 1.5, NULL, NULL, NULL, NULL, NULL)",
    "INSERT INTO review_events VALUES (1, 1, 1.0, 'predictor', 'enqueued', NULL)",
    "INSERT INTO review_events VALUES (2, 2, 1.5, 'predictor', 'enqueued', NULL)",
    "INSERT INTO review_events VALUES (3, 1, 2.0, 'alice', 'claimed', 'lease 900 s')",
    "INSERT INTO review_events VALUES (4, 1, 3.0, 'alice', 'rejected', 'bad')",
]


def test_a_v1_queue_is_migrated_without_losing_anything(sqlite_url):
    import sqlite3
    from pathlib import Path

    con = sqlite3.connect(sqlite_url)
    con.executescript(";\n".join(V1_DDL) + ";")
    con.commit()
    con.close()
    store = ReviewStore(sqlite_url)
    a, b = store.get(1), store.get(2)
    assert (a["state"], a["decided_by"], a["comment"], a["band"]) == ("rejected", "alice", "bad",
                                                                       "very_low")
    assert a["folder"] == str(Path("/preds/a")) and a["paths"] == {"pdb": "a.pdb", "cif": "a.cif"}
    assert b["folder"] is None and b["details"]["v1_paths"]["cif"] == "/y/b.cif"  # kept, not served
    assert [(e["actor"], e["action"]) for e in store.events(1)] == [
        ("predictor", "enqueued"), ("alice", "claimed"), ("alice", "rejected")]
    report = store.verify()
    assert report["ok"], report["problems"]
    assert store.reviewers()[0]["name"] == "alice"
    assert store.init_admin()  # a migrated queue gets its first admin
