"""Reviewer web UI in-process (FastAPI TestClient over the real app and a real SQLite queue):
login and server-side sessions, auth + CSRF on every mutating route, escaping and bidi,
hostile parameters (400, never 500), file serving, GET never writes, decisions with drafts,
claim-next, batch decisions, sorting and totals, admin pages."""

from __future__ import annotations

import json
import re
import sqlite3
import warnings
from html.parser import HTMLParser

import pytest
from review_fixtures import gated_item, pg_schema_url, queue_with

from protdp.review.store import ReviewStore
from protdp.review.web import SESSION_COOKIE, create_app, plddt_plot

with warnings.catch_warnings():  # starlette suggests httpx2, which is not packaged here
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

XSS = '"><script>alert(1)</script><img src=x onerror=alert(2)><svg onload=alert(3)>'


@pytest.fixture
def env(tmp_path):
    store, admin, tokens = queue_with(str(tmp_path / "queue.sqlite"), "alice", "bob")
    tokens["root"] = admin.add_reviewer("root", admin=True)
    for i in (1, 2, 3):
        store.enqueue(**gated_item(i, out_dir=tmp_path / "preds"))
    app = create_app(store)
    return store, app, tokens


def login(client: TestClient, token: str, next_path: str = "/queue"):
    page = client.get("/login")
    login_csrf = re.search(r'name="login_csrf" value="(\w+)"', page.text).group(1)
    return client.post("/login", data={"token": token, "login_csrf": login_csrf,
                                       "next": next_path}, follow_redirects=False)


def csrf_of(client: TestClient, path: str = "/queue") -> str:
    return re.search(r'name="csrf_token" value="(\w+)"', client.get(path).text).group(1)


def logged_in(app, token) -> TestClient:
    client = TestClient(app)
    assert login(client, token).status_code == 303
    return client


class Tags(HTMLParser):
    """Every start tag with its attributes, and all text."""

    def __init__(self, html: str):
        super().__init__()
        self.tags, self.text = [], []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_band_colours_come_from_their_one_definition(env):
    from protdp.gating import AFDB_BAND_COLORS

    _, app, _ = env
    client = TestClient(app)
    css = client.get("/bands.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    for band, colour in AFDB_BAND_COLORS.items():
        assert f".band-{band} {{ background: {colour};" in css.text
    assert '<link rel="stylesheet" href="/bands.css">' in client.get("/login").text


def test_login_flow_and_server_side_logout(env):
    store, app, tokens = env
    client = TestClient(app)
    resp = client.get("/queue", follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/login")
    assert login(client, tokens["alice"] + "x").status_code == 401
    client.get("/login")  # the login form itself is CSRF-protected (double-submit cookie)
    assert client.post("/login", data={"token": tokens["alice"], "login_csrf": "forged"},
                       follow_redirects=False).status_code == 403
    resp = login(client, tokens["alice"], next_path="//evil.example/x")
    assert resp.status_code == 303 and resp.headers["location"] == "/queue"  # no open redirect
    cookie = resp.headers["set-cookie"]
    assert SESSION_COOKIE in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    page = client.get("/queue")
    assert page.status_code == 200 and "signed in as" in page.text and "alice" in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
    stolen = client.cookies[SESSION_COOKIE]
    assert client.post("/logout", data={"csrf_token": csrf_of(client)},
                       follow_redirects=False).status_code == 303
    assert client.get("/queue", follow_redirects=False).status_code == 303
    replay = TestClient(app, cookies={SESSION_COOKIE: stolen})  # a copied cookie is dead too
    assert replay.get("/queue", follow_redirects=False).status_code == 303
    assert replay.post("/items/1/claim", data={"csrf_token": "x"}).status_code == 401


MUTATING = [("/items/1/decide", {"action": "approve", "comment": "ok"}),
            ("/items/1/claim", {}),
            ("/items/1/renew", {}),
            ("/items/1/release", {}),
            ("/queue/claim-next", {}),
            ("/queue/batch", {"ids": ["1"], "action": "approve", "confirm_count": "1"}),
            ("/admin/reviewers", {"name": "eve"}),
            ("/admin/reviewers/remove", {"name": "bob"}),
            ("/admin/release", {"item_id": "1"}),
            ("/logout", {})]


@pytest.mark.parametrize("path,data", MUTATING)
def test_every_mutating_route_requires_auth_and_csrf(env, path, data):
    store, app, tokens = env
    before = (store.get(1), len(store.events()), store.reviewers())

    anon = TestClient(app)
    assert anon.post(path, data=data, follow_redirects=False).status_code == 401
    assert anon.post(path, data=data, headers={"Authorization": f"Bearer {tokens['alice']}x"},
                     follow_redirects=False).status_code == 401
    assert anon.post(path, data=data, headers={"Authorization": "Basic YWxpY2U6eA=="},
                     follow_redirects=False).status_code == 401
    forged = TestClient(app, cookies={SESSION_COOKIE: "alice"})
    assert forged.post(path, data={**data, "csrf_token": "x"},
                       follow_redirects=False).status_code == 401
    # a real session that has expired (issued by an app with a negative session length)
    issued = login(TestClient(create_app(store, session_seconds=-10)), tokens["root"])
    stale_cookie = re.search(SESSION_COOKIE + r'="?([^";]+)', issued.headers["set-cookie"]).group(1)
    stale = TestClient(app, cookies={SESSION_COOKIE: stale_cookie})
    assert stale.post(path, data=data, follow_redirects=False).status_code == 401

    root = logged_in(app, tokens["root"])
    assert root.post(path, data=data, follow_redirects=False).status_code == 403  # no CSRF
    bob = logged_in(app, tokens["bob"])
    assert root.post(path, data={**data, "csrf_token": csrf_of(bob)},
                     follow_redirects=False).status_code == 403  # someone else's CSRF token
    if path.startswith("/admin"):
        assert bob.post(path, data={**data, "csrf_token": csrf_of(bob)},
                        follow_redirects=False).status_code == 403  # not an admin
    assert (store.get(1), len(store.events()), store.reviewers()) == before  # nothing changed

    if path.endswith(("renew", "release")):
        store.reviewer(tokens["root"]).claim(1)
    ok = root.post(path, data={**data, "csrf_token": csrf_of(root)}, follow_redirects=False)
    assert ok.status_code in (200, 303), ok.text
    bearer = anon.post("/items/2/decide", data={"action": "reject", "comment": "api"},
                       headers={"Authorization": f"Bearer {tokens['alice']}"},
                       follow_redirects=False)
    assert bearer.status_code == 303 and store.get(2)["decided_by"] == "alice"


def test_xss_and_bidi_in_user_text_render_inert(tmp_path):
    store, admin, tokens = queue_with(str(tmp_path / "queue.sqlite"), "alice")
    item = gated_item(1)
    spoof = "alice\u202egnp.exe"
    item_id = store.enqueue(**{**item, "target": spoof + XSS, "prediction_id": "run/" + XSS,
                               "details": {**item["details"], "shallow_msa": XSS}})
    store.reviewer(tokens["alice"]).decide(item_id, "escalate", spoof + XSS)
    client = logged_in(create_app(store), tokens["alice"])
    for path in ("/queue?state=all", f"/items/{item_id}", "/queue?state=all&target=" + XSS[:10],
                 "/export?format=jsonl"):
        page = client.get(path)
        assert page.status_code == 200
        if path.startswith("/export"):
            assert page.headers["content-disposition"].startswith("attachment")
            continue
        assert XSS not in page.text and "<script>alert" not in page.text
        assert "\u202e" not in page.text and "alice&lt;U+202E&gt;gnp.exe" in page.text
        parsed = Tags(page.text)
        assert all(a.get("src", "").startswith("/static/") for t, a in parsed.tags
                   if t == "script")
        assert not [(t, a) for t, attrs in parsed.tags for a in attrs if a.startswith("on")]
        assert not [t for t, attrs in parsed.tags if t == "img" and "x" == attrs.get("src")]
    assert XSS in "".join(Tags(client.get(f"/items/{item_id}").text).text)
    page = client.get(f"/items/{item_id}/files/{XSS}")
    assert page.status_code == 404 and "<script>alert" not in page.text


def test_a_huge_target_name_is_truncated_in_the_list_and_whole_on_the_item_page(env):
    store, app, tokens = env
    big = "A" * 1_000_000
    item_id = store.enqueue(**{**gated_item(9), "target": big})
    client = logged_in(app, tokens["alice"])
    queue = client.get("/queue")
    assert big not in queue.text and "A" * 79 + "…" in queue.text
    assert len(queue.text) < 100_000
    assert big in client.get(f"/items/{item_id}").text


@pytest.mark.parametrize("path", [
    "/items/9223372036854775808", "/items/2147483648", "/items/-1", "/items/1e3",
    "/items/9223372036854775808/files/pdb", "/queue?page=9223372036854775808",
    "/queue?page=0", "/queue?decided=99999999999999999999", "/queue?target=a%00b",
    "/queue?state=bogus", "/queue?sort=token_sha256", "/queue?reason=%00", "/items/1/pae.png?x=1",
    "/export?format=xml"])
def test_hostile_parameters_give_400_or_404_never_500(env, path):
    store, app, tokens = env
    client = logged_in(app, tokens["alice"])
    resp = client.get(path)
    assert resp.status_code in (400, 404), (path, resp.status_code)
    assert "Traceback" not in resp.text
    resp = client.post("/items/9223372036854775808/decide", data={
        "csrf_token": csrf_of(client), "action": "approve"})
    assert resp.status_code == 400
    resp = client.post("/queue/batch", data={"csrf_token": csrf_of(client),
                                             "ids": [str(2**63)], "action": "approve"})
    assert resp.status_code == 400


def test_get_requests_never_write(env, tmp_path):
    store, app, tokens = env
    alice = store.reviewer(tokens["alice"])
    alice.claim(1, lease_seconds=0.05)                    # a lease that runs out at once
    client = logged_in(app, tokens["bob"])
    import time
    time.sleep(0.1)
    db = sqlite3.connect(tmp_path / "queue.sqlite")
    snapshot = lambda: (db.execute("SELECT * FROM review_items").fetchall(),  # noqa: E731
                        db.execute("SELECT count(*) FROM review_events").fetchone())
    before = snapshot()
    for path in ("/queue", "/queue?state=pending", "/items/1", "/items/1/files/pdb",
                 "/export?format=csv", "/queue?state=claimed"):
        assert client.get(path).status_code == 200
    assert snapshot() == before
    assert "pending" in client.get("/items/1").text      # shown as pending all the same


def test_item_page_shows_plot_bands_reasons_and_file_links(env):
    store, app, tokens = env
    client = logged_in(app, tokens["alice"])
    page = client.get("/items/1")
    item = store.get(1)
    assert page.status_code == 200
    parsed = Tags(page.text)
    lines = [a for t, a in parsed.tags if t == "polyline" and a.get("class") == "plddt"]
    assert len(lines) == 1 and len(lines[0]["points"].split()) == len(item["scores"]["plddt"])
    assert len([a for t, a in parsed.tags if t == "rect" and a.get("class") == "band-bg"]) == 4
    text = " ".join(" ".join(parsed.text).split())
    for code in item["reasons"]:
        assert code in text
    assert "Very low (pLDDT < 50) 40.0 %" in text  # AFDB band fractions of the 30..80 ramp
    links = {a["href"] for t, a in parsed.tags if t == "a" and "file" in a.get("class", "")}
    assert links == {"/items/1/files/pdb", "/items/1/files/cif"}
    pdb = client.get("/items/1/files/pdb")
    assert pdb.status_code == 200 and pdb.text == open(f"{item['folder']}/pred1.pdb").read()
    assert pdb.headers["content-type"] == "chemical/x-pdb"
    assert pdb.headers["content-disposition"] == 'inline; filename="pred1.pdb"'
    assert client.get("/items/1/files/cif").headers["content-type"] == "chemical/x-mmcif"
    assert client.get("/items/1/files/provenance").status_code == 404
    assert client.get("/items/99").status_code == 404


def test_the_item_page_reads_the_stored_band(env):
    """The band shown is the one the gate stored with the item, not one re-derived here."""
    store, app, tokens = env
    item_id = store.enqueue(**{**gated_item(7, mean=60.0), "scores": {
        **gated_item(7, mean=60.0)["scores"], "band": "very_high"}})
    client = logged_in(app, tokens["alice"])
    assert "band band-very_high" in client.get(f"/items/{item_id}").text
    assert "band band-very_high" in client.get("/queue").text


def test_served_files_stay_in_the_items_folder(env, tmp_path):
    store, app, tokens = env
    secret = tmp_path / "outside.pdb"
    secret.write_text("SECRET\n")
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE review_items SET paths = ? WHERE id = 2",
                             (json.dumps({"pdb": str(secret)}),))
        conn.exec_driver_sql("UPDATE review_items SET paths = ?, folder = ? WHERE id = 3",
                             (json.dumps({"pdb": "outside.pdb"}), str(tmp_path / "preds/..")))
    (tmp_path / "preds" / "pred1.pdb").unlink()
    (tmp_path / "preds" / "pred1.pdb").symlink_to(secret)
    client = logged_in(app, tokens["alice"])
    for item_id in (1, 2, 3):
        resp = client.get(f"/items/{item_id}/files/pdb")
        assert resp.status_code == 404 and "SECRET" not in resp.text
    confined = logged_in(create_app(store, files_roots=[tmp_path / "elsewhere"]), tokens["alice"])
    assert confined.get("/items/1/files/cif").status_code == 404


def test_plddt_plot_geometry():
    plot = plddt_plot([100.0, 50.0, None, 0.0], width=144, height=140)
    # plot area: x 44..134 (w 90), y 10..110 (h 100); 4 residues -> x step 30
    assert plot["segments"] == ["44.0,10.0 74.0,60.0", "134.0,110.0"]
    bands = {b["name"]: (b["y"], b["height"]) for b in plot["bands"]}
    assert bands == {"very_high": (10.0, 10.0), "confident": (20.0, 20.0), "low": (40.0, 20.0),
                     "very_low": (60.0, 50.0)}
    assert plddt_plot([])["segments"] == []


def test_decisions_conflicts_drafts_filters_and_export(env):
    store, app, tokens = env
    alice, bob = logged_in(app, tokens["alice"]), logged_in(app, tokens["bob"])
    assert alice.post("/items/1/claim", data={"csrf_token": csrf_of(alice)},
                      follow_redirects=False).status_code == 303
    resp = bob.post("/items/1/decide", data={"csrf_token": csrf_of(bob), "action": "approve",
                                             "comment": "my careful notes"})
    assert resp.status_code == 409 and "claimed by alice" in resp.text
    assert "my careful notes</textarea>" not in resp.text  # bob cannot decide: no form ...
    resp = alice.post("/items/1/decide", data={"csrf_token": csrf_of(alice), "action": "reject"})
    assert resp.status_code == 400 and "comment is required" in resp.text
    resp = alice.post("/items/1/decide", data={"csrf_token": csrf_of(alice), "action": "escalate",
                                               "comment": "half a thought\x00"})
    assert resp.status_code == 400 and "half a thought\\x00</textarea>" in resp.text  # kept
    resp = alice.post("/items/1/decide", data={"csrf_token": csrf_of(alice), "action": "approve",
                                               "comment": "looks right"}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/queue?decided=1"
    queue = alice.get(resp.headers["location"])
    assert "Item 1 (target1) approved." in queue.text
    assert 'href="/items/1"' not in queue.text and 'href="/items/2"' in queue.text
    assert 'href="/items/1"' in alice.get("/queue?state=approved").text
    assert 'href="/items/1"' not in alice.get("/queue?state=all&target=target2").text
    assert 'href="/items/2"' in alice.get("/queue?reason=shallow_msa").text
    assert 'href="/items/2"' not in alice.get("/queue?reason=screening").text
    export = alice.get("/export?format=jsonl")
    recs = [json.loads(line) for line in export.text.splitlines()]
    assert [(r["item_id"], r["decision"], r["comment"]) for r in recs] == [
        (1, "approved", "looks right")]
    assert alice.get("/export?format=csv").text.startswith("item_id,")
    assert TestClient(app).get("/export", follow_redirects=False).status_code == 303


def test_expired_lease_keeps_the_typed_comment(env):
    store, app, tokens = env
    alice, bob = logged_in(app, tokens["alice"]), logged_in(app, tokens["bob"])
    store.reviewer(tokens["alice"]).claim(1, lease_seconds=0.05)
    import time
    time.sleep(0.1)
    store.reviewer(tokens["bob"]).claim(1)                 # bob takes the expired item
    resp = alice.post("/items/1/decide", data={"csrf_token": csrf_of(alice), "action": "reject",
                                               "comment": "two paragraphs of analysis"})
    assert resp.status_code == 409 and "claimed by bob" in resp.text
    assert 'id="decide-error"' in resp.text
    del bob


def test_claim_next_batch_sorting_and_totals(env):
    store, app, tokens = env
    alice, bob = logged_in(app, tokens["alice"]), logged_in(app, tokens["bob"])
    first = alice.post("/queue/claim-next", data={"csrf_token": csrf_of(alice)},
                       follow_redirects=False)
    second = bob.post("/queue/claim-next", data={"csrf_token": csrf_of(bob)},
                      follow_redirects=False)
    assert first.headers["location"] == "/items/1" and second.headers["location"] == "/items/2"
    assert "You hold:" in alice.get("/queue").text
    page = alice.get("/queue?sort=id&dir=desc")
    ids = [int(m) for m in re.findall(r'<tr data-item-id="(\d+)"', page.text)]
    assert ids == [3, 2, 1]
    totals = Tags(page.text)
    assert "pending 1" in " ".join(" ".join(totals.text).split())
    assert "items 1–3 of 3" in page.text
    resp = alice.post("/queue/batch", data={"csrf_token": csrf_of(alice), "ids": ["1", "2", "3"],
                                            "action": "approve", "comment": "batch ok",
                                            "confirm_count": "3"})
    outcome = dict(re.findall(r'<tr data-item-id="(\d+)" class="(\w+)"', resp.text))
    assert outcome == {"1": "failed", "2": "failed", "3": "failed"}   # none opened yet
    assert "not opened this item in this session" in resp.text
    for i in (1, 2, 3):
        assert alice.get(f"/items/{i}").status_code == 200
    resp = alice.post("/queue/batch", data={"csrf_token": csrf_of(alice), "ids": ["1", "2", "3"],
                                            "action": "approve", "comment": "batch ok"})
    assert resp.status_code == 400 and "type 3" in resp.text         # count not confirmed
    resp = alice.post("/queue/batch", data={"csrf_token": csrf_of(alice), "ids": ["1", "2", "3"],
                                            "action": "approve", "comment": "batch ok",
                                            "confirm_count": "3"})
    assert resp.status_code == 200
    outcome = dict(re.findall(r'<tr data-item-id="(\d+)" class="(\w+)"', resp.text))
    assert outcome == {"1": "ok", "2": "failed", "3": "ok"}  # bob holds 2
    assert "claimed by bob" in resp.text
    assert [store.get(i)["state"] for i in (1, 2, 3)] == ["approved", "claimed", "approved"]
    assert store.get(3)["comment"] == "batch ok"
    empty = alice.post("/queue/claim-next", data={"csrf_token": csrf_of(alice)},
                       follow_redirects=False)
    assert empty.headers["location"] == "/queue?empty=1"


def test_admin_pages(env):
    store, app, tokens = env
    root, alice = logged_in(app, tokens["root"]), logged_in(app, tokens["alice"])
    assert alice.get("/admin").status_code == 403
    page = root.post("/admin/reviewers", data={"csrf_token": csrf_of(root), "name": "carol"})
    token = re.search(r"<code>(pdr_[\w-]+)</code>", page.text).group(1)
    assert store.authenticate(token) == "carol"
    store.reviewer(tokens["alice"]).claim(1)
    page = root.post("/admin/reviewers/remove", data={"csrf_token": csrf_of(root),
                                                      "name": "alice"})
    assert "1 claim(s) released" in page.text and store.get(1)["state"] == "pending"
    assert alice.get("/queue", follow_redirects=False).status_code == 303  # session ended
    assert store.verify()["ok"]


def test_busy_queue_is_a_503_with_retry_after(env, tmp_path):
    store, app, tokens = env
    impatient = create_app(ReviewStore(str(tmp_path / "queue.sqlite"), busy_timeout_s=0.3))
    client = logged_in(impatient, tokens["alice"])
    csrf = csrf_of(client)
    stall = sqlite3.connect(tmp_path / "queue.sqlite", isolation_level=None)
    stall.execute("BEGIN IMMEDIATE")
    try:
        resp = client.post("/items/1/claim", data={"csrf_token": csrf})
        assert resp.status_code == 503 and resp.headers["retry-after"] == "5"
        assert "is busy" in resp.text and "Traceback" not in resp.text
        assert client.get("/queue").status_code == 200   # reading still works
    finally:
        stall.rollback()
        stall.close()


def test_web_ui_on_postgresql():
    with pg_schema_url() as url:
        store, admin, tokens = queue_with(url, "alice")
        store.enqueue(**gated_item(1))
        client = logged_in(create_app(store), tokens["alice"])
        resp = client.post("/items/1/decide", data={"csrf_token": csrf_of(client),
                                                    "action": "approve"}, follow_redirects=False)
        assert resp.status_code == 303 and store.get(1)["state"] == "approved"
        assert client.get("/items/2147483648").status_code == 400
        assert client.get("/queue?target=a%00b").status_code == 400
        store.close()


def test_a_crafted_form_cannot_hold_items_for_a_day(env):
    """The old claim form took `lease_seconds` from the client: 24 h, any number of items."""
    store, app, tokens = env
    admin = store.admin(tokens["root"])
    admin.set_limits(max_claims_per_reviewer=2, max_lease_seconds=600, default_lease_seconds=300)
    client = logged_in(app, tokens["alice"])
    for item_id in (1, 2):
        resp = client.post(f"/items/{item_id}/claim", data={
            "csrf_token": csrf_of(client), "lease_seconds": "86400"}, follow_redirects=False)
        assert resp.status_code == 303
        assert store.get(item_id)["lease_remaining_s"] <= 300
    resp = client.post("/items/3/claim", data={"csrf_token": csrf_of(client),
                                               "lease_seconds": "86400"})
    assert resp.status_code == 409 and "already holds 2 items" in resp.text
    resp = client.post("/items/1/renew", data={"csrf_token": csrf_of(client)},
                       headers={"Accept": "application/json"})
    assert resp.status_code == 200 and 0 < resp.json()["lease_remaining_s"] <= 300
