"""Issue 26: an approval binds the bytes, the database is not the authority (SQLite and
PostgreSQL, each forgery attempted with a database credential but without the server's audit
key, on PostgreSQL as the least-privilege app and enqueue roles), superseded predictions."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid

import pytest
from review_fixtures import gated_item, pg_schema_url, queue_url, queue_with  # noqa: F401
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from protdp.review import audit
from protdp.review.binding import mismatches
from protdp.review.enqueue import Enqueuer
from protdp.review.errors import AuthError, ClaimConflict, QueueError
from protdp.review.schema import events
from protdp.review.store import ReviewStore
from protdp.review.trusted import trusted_records


def _files_item(tmp_path, i: int, target: str | None = None) -> dict:
    """enqueue() kwargs of an item with a real structure file and scores.json."""
    kw = gated_item(i, target=target, out_dir=tmp_path / f"pred{i}")
    (tmp_path / f"pred{i}" / "scores.json").write_text(json.dumps({"mean_plddt": 55.0}))
    kw["prediction_id"] = f"{kw['target']}/{uuid.uuid4().hex[:8]}"
    return kw


@pytest.fixture
def approved(queue_url, tmp_path):
    store = ReviewStore(queue_url)
    store.set_files_roots([tmp_path])            # init-db --files-root (SQLite's default too)
    admin_token = store.init_admin()
    admin = store.admin(admin_token)
    tokens = {n: admin.add_reviewer(n) for n in ("alice", "bob")}
    item = store.enqueue(**_files_item(tmp_path, 1))
    store.reviewer(tokens["alice"]).decide(item, "approve")
    yield store, admin_token, tokens, item
    store.close()


def test_approval_binds_the_bytes_of_every_file(approved, tmp_path):
    store, admin_token, _, item = approved
    pdb = tmp_path / "pred1" / "pred1.pdb"
    row = store.get(item)
    with store.db.tx(readonly=True) as conn:
        recorded = conn.execute(text(f"SELECT file_sha256 FROM review_items WHERE id = {item}")
                                ).scalar()
    recorded = recorded if isinstance(recorded, dict) else json.loads(recorded)
    assert recorded["pdb"] == hashlib.sha256(pdb.read_bytes()).hexdigest()   # hashlib peer
    assert recorded["scores"] == hashlib.sha256(
        (tmp_path / "pred1" / "scores.json").read_bytes()).hexdigest()
    kept, refused = trusted_records(store, admin_token, require_bytes=True)
    assert [r["item_id"] for r in kept] == [item] and not refused
    original = pdb.read_bytes()
    pdb.write_bytes(original.replace(b"prediction", b"predictioN"))   # edited after approval
    kept, refused = trusted_records(store, admin_token, require_bytes=True)
    assert not kept and "pdb: changed since enqueue" in refused[0]["reason"]
    pdb.unlink()
    kept, refused = trusted_records(store, admin_token, require_bytes=True)
    assert not kept and "pdb: gone since enqueue" in refused[0]["reason"]
    pdb.write_bytes(original)
    assert trusted_records(store, admin_token, require_bytes=True)[0]
    assert row["state"] == "approved" and store.verify()["ok"]


def test_export_needs_an_admin_token(approved):
    store, _, tokens, _ = approved
    for token in (None, "", tokens["alice"]):
        with pytest.raises(AuthError):
            trusted_records(store, token, require_bytes=True)


def test_a_new_prediction_supersedes_the_old_item(approved, tmp_path):
    store, admin_token, tokens, old = approved
    kw = _files_item(tmp_path, 2, target="target1")
    new = store.enqueue(**kw)
    assert store.enqueue(**kw) == new                     # re-gating the same prediction: same item
    kept, refused = trusted_records(store, admin_token, require_bytes=True)
    assert not kept and f"superseded by item {new}" in refused[0]["reason"]
    open_old = store.enqueue(**_files_item(tmp_path, 3, target="t3"))
    store.enqueue(**_files_item(tmp_path, 4, target="t3"))
    bob = store.reviewer(tokens["bob"])
    with pytest.raises(ClaimConflict, match="superseded"):
        bob.claim(open_old)
    with pytest.raises(ClaimConflict, match="superseded"):
        bob.decide(open_old, "approve")
    assert store.verify()["ok"]
    # the pointer cannot be cleared behind the log's back
    with store.engine.begin() as conn:
        conn.execute(text(f"UPDATE review_items SET superseded_by = NULL WHERE id = {old}"))
    assert any(f"item {old}: superseded_by" in p for p in store.verify()["problems"])


def test_a_redone_prediction_rebinds_only_when_asked_and_bytes_differ(queue_url, tmp_path):
    """The predictor predicted a target again after its folder was damaged (`rebind`): the old
    item is bound to bytes that are gone, so a new item `<id>~2` supersedes it; a plain
    re-enqueue (a rerun that found the folder complete) never takes on changed bytes."""
    store = ReviewStore(queue_url)
    store.set_files_roots([tmp_path])
    alice = store.reviewer(store.admin(store.init_admin()).add_reviewer("alice"))
    kw = _files_item(tmp_path, 1)
    first = store.enqueue(**kw)
    assert store.enqueue(**kw, rebind=True) == first              # same bytes: the same item
    pdb = tmp_path / "pred1" / "pred1.pdb"
    pdb.write_bytes(pdb.read_bytes() + b"REMARK predicted again\n")
    assert store.enqueue(**kw) == first                           # not rebound without asking
    second = store.enqueue(**kw, rebind=True)
    new, old = store.get(second), store.get(first)
    assert new["prediction_id"] == kw["prediction_id"] + "~2" and old["superseded_by"] == second
    assert mismatches(new) == [] and "pdb: changed since enqueue" in mismatches(old)[0]
    assert store.enqueue(**kw) == second                          # the newest item of the id
    with pytest.raises(ClaimConflict, match="superseded"):
        alice.decide(first, "approve")
    alice.decide(second, "approve")
    assert store.verify()["ok"]
    store.close()


def test_file_roots_are_fixed_at_init_and_enforced(queue_url, tmp_path):
    from fastapi.testclient import TestClient

    from protdp.errors import InputError
    from protdp.review.web import create_app
    store = ReviewStore(queue_url)
    inside, outside = tmp_path / "preds", tmp_path.parent / f"decoy_{uuid.uuid4().hex[:6]}"
    store.set_files_roots([inside])
    admin_token = store.init_admin()
    with pytest.raises(QueueError, match="fixed when it is initialised"):
        store.set_files_roots([outside])
    ok = store.enqueue(**gated_item(1, out_dir=inside / "p1"))
    with pytest.raises(InputError, match="outside the queue's file roots"):
        store.enqueue(**gated_item(2, out_dir=outside))
    # a server asked to serve a wider root serves only what the queue allows
    app = create_app(store, files_roots=[tmp_path.parent])
    assert app.state.files_roots == []
    client = TestClient(create_app(store))
    page = client.get("/login")
    login_csrf = re.search(r'name="login_csrf" value="(\w+)"', page.text).group(1)
    assert client.post("/login", data={"token": admin_token, "login_csrf": login_csrf},
                       follow_redirects=False).status_code == 303
    assert client.get(f"/items/{ok}/files/pdb").status_code == 200
    store.close()


# ------------------------------------------------------------------ forgeries without the key

def _chain_append(conn, **ev):
    """What someone holding only a database credential can do: extend the public chain."""
    head = conn.execute(select(events.c.seq, events.c.hash).order_by(events.c.seq.desc())
                        .limit(1)).first()
    row = {"seq": head.seq + 1, "item_id": None, "subject": None, "at": 1e9, "comment": None,
           "bound_sha256": None, **ev}
    row["prev_hash"], row["hash"] = head.hash, audit.event_hash(head.hash, row)
    conn.execute(events.insert().values(**row))


def _forge_all(engine, other_item):
    """Every forgery of the issue, as plain SQL on `engine`; returns the forged tokens."""
    with engine.begin() as conn:
        # 1. a web session for the admin, hashed the way a plain SHA-256 queue would
        conn.execute(text("INSERT INTO review_sessions (token_sha256, reviewer, created_at, "
                          "expires_at) VALUES (:h, 'admin', 0, 1e12)"),
                     {"h": hashlib.sha256(b"forged-session").hexdigest()})
    # 2. an approval in bob's name with a correctly chained event: refused unsigned by the
    # insert trigger, and with a made-up mac it gets in but fails verify
    with pytest.raises(Exception, match="unsigned audit event"), engine.begin() as conn:
        _chain_append(conn, item_id=other_item, actor="bob", action="approved")
    with engine.begin() as conn:
        conn.execute(text("UPDATE review_items SET state = 'approved', decided_by = 'bob', "
                          f"decided_at = 1e9 WHERE id = {other_item}"))
        _chain_append(conn, item_id=other_item, actor="bob", action="approved", mac="0" * 64)
    return "forged-session"


def _check_forgeries_fail(store, admin_token, item, other_item, forged_item=None):
    assert store.session("forged-session") is None
    report = store.verify()
    assert not report["ok"]
    assert any("'approved' on item" in p and "not signed" in p for p in report["problems"])
    kept, refused = trusted_records(store, admin_token, require_bytes=False)
    refused_ids = {r["item_id"] for r in refused}
    assert other_item in refused_ids and item not in refused_ids
    if forged_item is not None:
        assert forged_item not in {k["item_id"] for k in kept}
        assert any(f"on item {forged_item}" in p and "not signed" in p
                   for p in report["problems"])


def test_forgeries_with_a_database_credential_fail(approved, tmp_path):
    store, admin_token, tokens, item = approved
    other = store.enqueue(**_files_item(tmp_path, 5))
    # SQLite: whoever can write the file, without the key file
    _forge_all(store.engine, other)
    # a reviewer row added behind the queue's back, admin and with a token the forger knows
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO reviewers (name, token_sha256, active, is_admin, "
                          "created_at) VALUES ('mallory', :h, true, true, 0)"),
                     {"h": hashlib.sha256(b"pdr_mallory").hexdigest()})
    with pytest.raises(AuthError, match="signed audit events"):
        store.admin("pdr_mallory")
    # the API itself, without the key, cannot sign a decision
    keyless = ReviewStore(store.url)
    keyless.db.key = None
    with pytest.raises(AuthError):
        keyless.reviewer(tokens["bob"])
    keyless.close()
    assert store.session("forged-session") is None
    report = store.verify()
    assert any("not signed" in p for p in report["problems"])
    assert any("mallory" in p for p in report["problems"])
    with pytest.raises(QueueError, match="whole audit log"):     # a forged reviewer: nothing out
        trusted_records(store, admin_token, require_bytes=False)


def test_rewritten_chain_fails_verify(approved):
    """The owner drops the triggers and rewrites the approval's comment, recomputing every hash
    after it: the public chain checks out, the keyed one does not."""
    store, _, _, item = approved
    with store.engine.begin() as conn:
        if store.dialect == "sqlite":
            conn.execute(text("DROP TRIGGER review_events_no_update"))
        else:
            conn.execute(text("DROP TRIGGER review_events_append_only ON review_events"))
        rows = [dict(r) for r in conn.execute(select(events).order_by(events.c.seq)).mappings()]
        prev = audit.GENESIS_HASH
        for r in rows:
            if r["action"] == "approved":
                r["comment"] = "looks fine to me"
            r["prev_hash"], r["hash"] = prev, audit.event_hash(prev, r)
            prev = r["hash"]
            conn.execute(events.update().where(events.c.id == r["id"]).values(
                comment=r["comment"], prev_hash=r["prev_hash"], hash=r["hash"]))
        conn.execute(text(f"UPDATE review_items SET comment = 'looks fine to me' "
                          f"WHERE id = {item}"))
    problems = store.verify()["problems"]
    assert any("not signed" in p for p in problems) and not any("prev_hash" in p for p in problems)


def _role_url(base_url: str, role: str) -> str:
    return make_url(base_url).set(username=role, password="pw").render_as_string(
        hide_password=False)


def test_forgeries_as_each_postgresql_role_fail(tmp_path):
    """The least-privilege roles of `init-db --app-role/--enqueue-role` each try the forgeries
    their grants allow; the server's checks and `verify` refuse every one."""
    with pg_schema_url() as owner_url:
        store = ReviewStore(owner_url)
        roles = {"app": f"protdp_app_{uuid.uuid4().hex[:8]}",
                 "enqueue": f"protdp_enq_{uuid.uuid4().hex[:8]}"}
        with store.engine.begin() as conn:
            for role in roles.values():
                conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'"))
        try:
            for kind, role in roles.items():
                store.grant_role(role, kind)
            store.set_files_roots([tmp_path])
            admin_token = store.init_admin()
            tokens = {n: store.admin(admin_token).add_reviewer(n) for n in ("alice", "bob")}
            item = store.enqueue(**_files_item(tmp_path, 1))
            store.reviewer(tokens["alice"]).decide(item, "approve")
            kw5 = _files_item(tmp_path, 5)
            other = store.enqueue(**kw5)
            app = create_engine(make_url(_role_url(owner_url, roles["app"])).set(
                drivername="postgresql+psycopg2"))
            _forge_all(app, other)
            enq = create_engine(make_url(_role_url(owner_url, roles["enqueue"])).set(
                drivername="postgresql+psycopg2"))
            with pytest.raises(Exception, match="inserted pending only"), \
                    enq.begin() as conn:   # an item inserted already approved: refused
                conn.execute(text(
                    "INSERT INTO review_items (prediction_id, target, state, reasons, "
                    "reason_codes, details, scores, paths, created_at, decided_by) VALUES "
                    "('x/0', 'x', 'approved', '[]', ',,', '{}', '{}', '{}', 0, 'alice')"))
            with enq.begin() as conn:   # pending, then an approval event with a made-up mac
                forged = conn.execute(text(
                    "INSERT INTO review_items (prediction_id, target, state, reasons, "
                    "reason_codes, details, scores, paths, created_at, decided_by) VALUES "
                    "('x/1', 'x', 'pending', '[]', ',,', '{}', '{}', '{}', 0, NULL) "
                    "RETURNING id")).scalar()
                _chain_append(conn, item_id=forged, actor="predictor", action="enqueued",
                              comment="sha256 0")
                _chain_append(conn, item_id=forged, actor="alice", action="approved",
                              mac="f" * 64)
            with pytest.raises(Exception, match="permission denied"), enq.begin() as conn:
                conn.execute(text("INSERT INTO review_sessions (token_sha256, reviewer, "
                                  "created_at, expires_at) VALUES ('h', 'admin', 0, 1)"))
            _check_forgeries_fail(store, admin_token, item, other, forged)
            # the enqueue role's grants cover queueing a redone prediction again (rebind)
            pdb5 = tmp_path / "pred5" / "pred5.pdb"
            pdb5.write_bytes(pdb5.read_bytes() + b"REMARK predicted again\n")
            door = Enqueuer(_role_url(owner_url, roles["enqueue"]))
            assert door.enqueue(**kw5, rebind=True) not in (other, None)
            door.close()
            app.dispose()
            enq.dispose()
        finally:
            store.close()
            admin_engine = create_engine(make_url(owner_url).set(
                drivername="postgresql+psycopg2", query={}))
            with admin_engine.begin() as conn:
                for role in roles.values():
                    conn.execute(text(f"DROP OWNED BY {role}"))
                    conn.execute(text(f"DROP ROLE {role}"))
            admin_engine.dispose()


# ------------------------------------------------------------------ decisions a person made

def test_claim_next_after_release_gives_another_item_and_renewals_are_bounded(queue_url):
    store, admin, tokens = queue_with(queue_url, "alice")
    for i in (1, 2):
        store.enqueue(**gated_item(i))
    alice = store.reviewer(tokens["alice"])
    first = alice.claim()
    alice.release(first["id"])
    assert alice.claim()["id"] != first["id"]
    admin.set_limits(max_hold_seconds=2)
    alice.claim(first["id"])                                # a new claim: a full lease
    renewed = alice.claim(first["id"])
    assert renewed["lease_remaining_s"] <= 2.0                # a renewal never goes past the hold
    time.sleep(2.1)                                         # the hold ends
    with pytest.raises(ClaimConflict, match="renewals end"):
        alice.claim(first["id"])
    store.close()


def test_login_is_rate_limited_and_logout_clears_drafts(tmp_path):
    from fastapi.testclient import TestClient

    from protdp.review.web import create_app
    from protdp.review.web.auth import LOGIN_FAILURES
    store, _, tokens = queue_with(str(tmp_path / "q.sqlite"), "alice")
    client = TestClient(create_app(store))

    def login(token):
        page = client.get("/login")
        csrf = re.search(r'name="login_csrf" value="(\w+)"', page.text).group(1)
        return client.post("/login", data={"token": token, "login_csrf": csrf},
                           follow_redirects=False)

    for _ in range(LOGIN_FAILURES):
        assert login("pdr_wrong").status_code == 401
    assert login(tokens["alice"]).status_code == 429          # even the right token, for now
    fresh = TestClient(create_app(store))                      # another server process
    client = fresh
    assert login(tokens["alice"]).status_code == 303
    csrf = re.search(r'name="csrf_token" value="(\w+)"', client.get("/queue").text).group(1)
    out = client.post("/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["clear-site-data"] == '"storage"'
    store.close()


def test_large_structures_are_not_sent_to_the_viewer_and_pae_is_downsampled(tmp_path):
    import numpy as np
    from fastapi.testclient import TestClient

    from protdp.review.web import create_app
    from protdp.review.web.render import downsample_pae
    pae = np.random.default_rng(0).uniform(0, 30, (1030, 1030))
    small = downsample_pae(pae, 512)
    assert small.shape == (344, 344)                        # f = 3, ceil(1030 / 3)
    np.testing.assert_allclose(small[0, 0], pae[:3, :3].mean())
    np.testing.assert_allclose(small[-1, -1], pae[1029, 1029])   # edge block: one residue
    assert downsample_pae(pae[:100, :100]).shape == (100, 100)
    store, _, tokens = queue_with(str(tmp_path / "q.sqlite"), "alice")
    item = store.enqueue(**gated_item(1, out_dir=tmp_path / "preds"))
    (tmp_path / "preds" / "pred1.pdb").write_bytes(b"REMARK big\n" * 200_000)    # 2.2 MB
    client = TestClient(create_app(store, max_structure_bytes=2**20))
    client.headers["Authorization"] = f"Bearer {tokens['alice']}"
    resp = client.get(f"/items/{item}/files/pdb")
    assert resp.status_code == 413 and "limit" in resp.text
    assert client.get(f"/items/{item}/files/cif").status_code == 200
    store.close()


def test_verify_checks_leases_and_sessions_against_the_log(queue_url):
    store, admin, tokens = queue_with(queue_url, "alice")
    item = store.enqueue(**gated_item(1))
    store.reviewer(tokens["alice"]).claim(item)
    store.login(tokens["alice"])
    assert store.verify()["ok"]
    with store.engine.begin() as conn:      # a lease stretched by a day with a DB credential
        conn.execute(text("UPDATE review_items SET lease_expires_at = lease_expires_at + 86400"))
    assert any("past what its last claim event granted" in p for p in store.verify()["problems"])
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE review_items SET lease_expires_at = lease_expires_at - 86400"))
    admin.remove_reviewer("alice")
    assert store.verify()["ok"]                              # her sessions were revoked
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE review_sessions SET revoked_at = NULL"))
    assert any("not an active reviewer" in p for p in store.verify()["problems"])
    store.close()
