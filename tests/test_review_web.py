"""Reviewer web UI in-process (FastAPI TestClient over the real app and a real SQLite queue):
login, auth + CSRF on every mutating route, escaping, pLDDT plot, file links, decisions."""

from __future__ import annotations

import json
import re
import warnings
from html.parser import HTMLParser

import pytest
from review_fixtures import gated_item, pg_schema_url

from protdp.review.store import ReviewStore
from protdp.review.web import SESSION_COOKIE, create_app, plddt_plot

with warnings.catch_warnings():  # starlette suggests httpx2, which is not packaged here
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

XSS = '"><script>alert(1)</script><img src=x onerror=alert(2)><svg onload=alert(3)>'


@pytest.fixture
def env(tmp_path):
    store = ReviewStore(str(tmp_path / "queue.sqlite"))
    tokens = {name: store.add_reviewer(name) for name in ("alice", "bob")}
    for i in (1, 2, 3):
        store.enqueue(**gated_item(i, out_dir=tmp_path / "preds"))
    app = create_app(store, secret=b"s" * 32)
    return store, app, tokens


def login(client: TestClient, token: str, next_path: str = "/queue"):
    page = client.get("/login")
    login_csrf = re.search(r'name="login_csrf" value="(\w+)"', page.text).group(1)
    return client.post("/login", data={"token": token, "login_csrf": login_csrf,
                                       "next": next_path}, follow_redirects=False)


def csrf_of(client: TestClient, path: str = "/items/1") -> str:
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


def test_login_flow(env):
    store, app, tokens = env
    client = TestClient(app)
    resp = client.get("/queue", follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/login")
    assert login(client, tokens["alice"] + "x").status_code == 401
    page = client.get("/login")  # login form itself is CSRF-protected (double-submit cookie)
    assert client.post("/login", data={"token": tokens["alice"], "login_csrf": "forged"},
                       follow_redirects=False).status_code == 403
    resp = login(client, tokens["alice"], next_path="//evil.example/x")
    assert resp.status_code == 303 and resp.headers["location"] == "/queue"  # no open redirect
    cookie = resp.headers["set-cookie"]
    assert SESSION_COOKIE in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    page = client.get("/queue")
    assert page.status_code == 200 and "signed in as" in page.text and "alice" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert client.post("/logout", data={"csrf_token": csrf_of(client)},
                       follow_redirects=False).status_code == 303
    assert client.get("/queue", follow_redirects=False).status_code == 303


MUTATING = [("/items/1/decide", {"action": "approve", "comment": "ok"}),
            ("/items/1/claim", {"lease_seconds": "60"}),
            ("/logout", {})]


@pytest.mark.parametrize("path,data", MUTATING)
def test_every_mutating_route_requires_auth_and_csrf(env, path, data):
    store, app, tokens = env
    before = (store.get(1), len(store.events()))

    anon = TestClient(app)
    assert anon.post(path, data=data, follow_redirects=False).status_code == 401
    assert anon.post(path, data=data, headers={"Authorization": f"Bearer {tokens['alice']}x"},
                     follow_redirects=False).status_code == 401
    assert anon.post(path, data=data, headers={"Authorization": "Basic YWxpY2U6eA=="},
                     follow_redirects=False).status_code == 401

    alice = logged_in(app, tokens["alice"])
    session = alice.cookies[SESSION_COOKIE]
    name, expiry, nonce, sig = session.split(":")
    forged = TestClient(app, cookies={SESSION_COOKIE: f"bob:{expiry}:{nonce}:{sig}"})
    assert forged.post(path, data={**data, "csrf_token": csrf_of(alice)},
                       follow_redirects=False).status_code == 401
    # a correctly signed but expired session (issued by an app with negative session length)
    issued = login(TestClient(create_app(store, secret=b"s" * 32, session_seconds=-10)),
                   tokens["alice"])
    stale_cookie = re.search(SESSION_COOKIE + r'="?([^";]+)', issued.headers["set-cookie"]).group(1)
    assert stale_cookie.startswith("alice:")
    stale = TestClient(app, cookies={SESSION_COOKIE: stale_cookie})
    assert stale.post(path, data=data, follow_redirects=False).status_code == 401

    assert alice.post(path, data=data, follow_redirects=False).status_code == 403  # no CSRF
    bob = logged_in(app, tokens["bob"])
    assert alice.post(path, data={**data, "csrf_token": csrf_of(bob)},
                      follow_redirects=False).status_code == 403  # someone else's CSRF token
    assert (store.get(1), len(store.events())) == before  # nothing changed, nothing logged

    ok = alice.post(path, data={**data, "csrf_token": csrf_of(alice)}, follow_redirects=False)
    assert ok.status_code == 303
    bearer = anon.post("/items/2/decide", data={"action": "reject", "comment": "api"},
                       headers={"Authorization": f"Bearer {tokens['bob']}"},
                       follow_redirects=False)
    assert bearer.status_code == 303 and store.get(2)["decided_by"] == "bob"

    store.deactivate_reviewer("bob")
    assert bob.post(path, data={**data, "csrf_token": "x"}, follow_redirects=False).status_code \
        == 401


def test_xss_payload_in_user_text_renders_inert(tmp_path):
    store = ReviewStore(str(tmp_path / "queue.sqlite"))
    token = store.add_reviewer("alice")
    item = gated_item(1)
    item_id = store.enqueue(**{**item, "target": XSS, "prediction_id": "run/" + XSS,
                               "details": {**item["details"], "shallow_msa": XSS},
                               "paths": {XSS: "/nonexistent"}})
    store.claim("alice", 60)
    store.decide(item_id, "alice", "escalate", XSS)
    client = logged_in(create_app(store), token)
    for path in ("/queue?state=all", f"/items/{item_id}", "/queue?state=all&target=" + XSS[:10]):
        page = client.get(path)
        assert page.status_code == 200
        assert XSS not in page.text and "<script>alert" not in page.text
        parsed = Tags(page.text)
        assert not [t for t, _ in parsed.tags if t == "script"]
        assert not [(t, a) for t, attrs in parsed.tags for a in attrs if a.startswith("on")]
        assert not [t for t, attrs in parsed.tags if t == "img"]
        assert XSS in "".join(parsed.text)  # shown to the reviewer as literal text
    page = client.get(f"/items/{item_id}/files/{XSS}")
    assert page.status_code == 404 and "<script>alert" not in page.text


def test_item_page_shows_plot_bands_reasons_and_file_links(env):
    store, app, tokens = env
    client = logged_in(app, tokens["alice"])
    page = client.get("/items/1")
    item = store.get(1)
    assert page.status_code == 200
    parsed = Tags(page.text)
    lines = [a for t, a in parsed.tags if t == "polyline"]
    assert len(lines) == 1 and len(lines[0]["points"].split()) == len(item["scores"]["plddt"])
    assert len([a for t, a in parsed.tags if t == "rect" and a.get("class") == "band-bg"]) == 4
    text = " ".join(" ".join(parsed.text).split())
    for code in item["reasons"]:
        assert code in text
    assert "Very low (pLDDT < 50) 40.0 %" in text  # AFDB band fractions of the 30..80 ramp
    links = {a["href"] for t, a in parsed.tags if t == "a" and "file" in a.get("class", "")}
    assert links == {"/items/1/files/pdb", "/items/1/files/cif"}
    pdb = client.get("/items/1/files/pdb")
    assert pdb.status_code == 200 and pdb.text == open(item["paths"]["pdb"]).read()
    assert "attachment" in pdb.headers["content-disposition"]
    assert client.get("/items/1/files/provenance").status_code == 404
    assert client.get("/items/99").status_code == 404


def test_plddt_plot_geometry():
    plot = plddt_plot([100.0, 50.0, None, 0.0], width=144, height=140)
    # plot area: x 44..134 (w 90), y 10..110 (h 100); 4 residues -> x step 30
    assert plot["segments"] == ["44.0,10.0 74.0,60.0", "134.0,110.0"]
    bands = {b["name"]: (b["y"], b["height"]) for b in plot["bands"]}
    assert bands == {"very_high": (10.0, 10.0), "confident": (20.0, 20.0), "low": (40.0, 20.0),
                     "very_low": (60.0, 50.0)}
    assert plddt_plot([])["segments"] == []


def test_decisions_conflicts_filters_and_export(env):
    store, app, tokens = env
    alice, bob = logged_in(app, tokens["alice"]), logged_in(app, tokens["bob"])
    assert alice.post("/items/1/claim", data={"csrf_token": csrf_of(alice)},
                      follow_redirects=False).status_code == 303
    resp = bob.post("/items/1/decide", data={"csrf_token": csrf_of(bob), "action": "approve"})
    assert resp.status_code == 409 and "claimed by alice" in resp.text
    resp = alice.post("/items/1/decide", data={"csrf_token": csrf_of(alice), "action": "reject"})
    assert resp.status_code == 400 and "comment is required" in resp.text
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
    assert alice.get("/queue?state=bogus").status_code == 400
    export = alice.get("/export?format=jsonl")
    recs = [json.loads(line) for line in export.text.splitlines()]
    assert [(r["item_id"], r["decision"], r["comment"]) for r in recs] == [
        (1, "approved", "looks right")]
    assert [e["action"] for e in recs[0]["events"]] == ["enqueued", "claimed", "approved"]
    assert alice.get("/export?format=csv").text.startswith("item_id,")
    assert TestClient(app).get("/export", follow_redirects=False).status_code == 303


def test_web_ui_on_postgresql():
    with pg_schema_url() as url:
        store = ReviewStore(url)
        token = store.add_reviewer("alice")
        store.enqueue(**gated_item(1))
        client = logged_in(create_app(store), token)
        resp = client.post("/items/1/decide", data={"csrf_token": csrf_of(client),
                                                    "action": "approve"}, follow_redirects=False)
        assert resp.status_code == 303 and store.get(1)["state"] == "approved"
        store.close()
