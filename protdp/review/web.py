"""Reviewer web UI: FastAPI + Jinja2, server-rendered, no JavaScript.

Security model:
- Login exchanges a reviewer token for a session cookie `name:expiry:nonce:hmac` signed with a
  server secret (HttpOnly, SameSite=Strict). The reviewer must still be active on every request.
  API clients may instead send `Authorization: Bearer <token>`.
- Every POST is authenticated (401 without valid credentials) and, for cookie sessions, carries
  a CSRF token derived from the session by HMAC (403 when missing or wrong). The login form uses
  a double-submit cookie.
- Templates autoescape everything (target names and FASTA headers are user input), and a strict
  Content-Security-Policy forbids scripts outright, so even a missed escape could not run code.
- Every decision goes through `ReviewStore.decide`, which writes the audit event.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import jinja2
from fastapi import FastAPI, Form, Request
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from protdp.errors import InputError
from protdp.gating import AFDB_BAND_COLORS, AFDB_BAND_LABELS, AFDB_BANDS, REASON_TEXT, band_of
from protdp.gating.bands import band_ranges
from protdp.review.store import (ACTIONS, EXPORT_FORMATS, FINAL_STATES, STATES, ClaimConflict,
                                 ItemNotFound, QueueError, ReviewStore, iso)

HERE = Path(__file__).resolve().parent
SESSION_COOKIE = "protdp_session"
LOGIN_CSRF_COOKIE = "protdp_login_csrf"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class HTTPProblem(Exception):
    """An error page with a status code (401/403/404/409/400)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def plddt_plot(plddt: list, width: int = 720, height: int = 220) -> dict:
    """Geometry of the per-residue pLDDT SVG: AFDB band backgrounds and the pLDDT line.

    Pure layout math; the template draws it. Missing (null) values break the line.
    """
    left, right, top, bottom = 44, 10, 10, 30
    w, h = width - left - right, height - top - bottom
    n = len(plddt)

    def x(i: int) -> float:
        return left + (w / 2 if n < 2 else w * i / (n - 1))

    def y(v: float) -> float:
        return top + h * (100 - v) / 100

    segments, current = [], []
    for i, v in enumerate(plddt):
        if v is None:
            if current:
                segments.append(current)
            current = []
        else:
            current.append(f"{x(i):.1f},{y(float(v)):.1f}")
    if current:
        segments.append(current)
    bands = [{"name": b, "color": AFDB_BAND_COLORS[b], "y": y(hi), "height": y(lo) - y(hi)}
             for b, (lo, hi) in band_ranges().items()]
    step = max(1, round(n / 8)) if n else 1
    xticks = [{"x": x(i), "label": i + 1} for i in range(0, n, step)]
    edges = sorted({0.0, 100.0, *(lo for lo, _ in band_ranges().values())})
    yticks = [{"y": y(v), "label": f"{v:g}"} for v in edges]
    return {"width": width, "height": height, "left": left, "top": top, "plot_w": w, "plot_h": h,
            "bands": bands, "segments": [" ".join(s) for s in segments], "xticks": xticks,
            "yticks": yticks, "n": n, "bottom_y": top + h}


def _sign(secret: bytes, message: str) -> str:
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def create_app(store: ReviewStore | str, *, secret: bytes | None = None,
               session_seconds: int = 8 * 3600) -> FastAPI:
    """The review UI over `store` (a ReviewStore or its URL). `secret` signs sessions; a random
    one per process is used when None (sessions then end when the server restarts)."""
    store = ReviewStore(store) if isinstance(store, str) else store
    secret = secret or secrets.token_bytes(32)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.globals.update(REASON_TEXT=REASON_TEXT, AFDB_BAND_LABELS=AFDB_BAND_LABELS,
                       AFDB_BANDS=AFDB_BANDS, AFDB_COLORS=AFDB_BAND_COLORS, iso=iso, band_of=band_of)
    app = FastAPI(title="protdp review", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    # -- sessions ---------------------------------------------------------------------------

    def make_session(name: str) -> str:
        payload = f"{name}:{int(time.time()) + session_seconds}:{secrets.token_hex(8)}"
        return f"{payload}:{_sign(secret, 'session:' + payload)}"

    def session_reviewer(cookie: str | None) -> tuple[str, str] | None:
        """(reviewer, csrf token) for a valid session cookie, else None."""
        if not cookie or cookie.count(":") != 3:
            return None
        payload, sig = cookie.rsplit(":", 1)
        if not hmac.compare_digest(sig, _sign(secret, "session:" + payload)):
            return None
        name, expiry, _nonce = payload.split(":")
        if not expiry.isdigit() or int(expiry) < time.time() or not store.is_active_reviewer(name):
            return None
        return name, _sign(secret, "csrf:" + payload)

    def viewer(request: Request) -> tuple[str, str | None] | None:
        """(reviewer, csrf or None for bearer auth); raises 401 for a bad bearer token."""
        header = request.headers.get("authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            name = store.authenticate(token.strip()) if scheme.lower() == "bearer" else None
            if name is None:
                raise HTTPProblem(401, "invalid reviewer token")
            return name, None
        return session_reviewer(request.cookies.get(SESSION_COOKIE))

    def require_page(request: Request) -> tuple[str, str | None]:
        who = viewer(request)
        if who is None:
            raise HTTPProblem(303, "/login?" + urlencode({"next": request.url.path}))
        return who

    def require_post(request: Request, csrf_token: str) -> str:
        """The reviewer behind a mutating request: 401 without credentials, 403 on bad CSRF."""
        who = viewer(request)
        if who is None:
            raise HTTPProblem(401, "log in with a reviewer token first")
        name, expected = who
        if expected is not None and not hmac.compare_digest(csrf_token or "", expected):
            raise HTTPProblem(403, "form expired or forged (CSRF check failed); reload the page")
        return name

    def render(template: str, http_status: int = 200, **ctx) -> HTMLResponse:
        return HTMLResponse(env.get_template(template).render(**ctx), status_code=http_status)

    # -- error pages and headers ------------------------------------------------------------

    @app.exception_handler(HTTPProblem)
    def _problem(request: Request, exc: HTTPProblem):
        if exc.status == 303:
            return RedirectResponse(exc.message, status_code=303)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        resp = render("error.html", exc.status, reviewer=None, csrf=None, message=exc.message,
                      status=exc.status)
        if headers:
            resp.headers.update(headers)
        return resp

    for exc_type, status in ((ItemNotFound, 404), (ClaimConflict, 409), (InputError, 400),
                             (QueueError, 400)):
        def _handler(request: Request, exc, status=status):
            return _problem(request, HTTPProblem(status, str(exc)))
        app.add_exception_handler(exc_type, _handler)

    @app.middleware("http")
    async def _headers(request: Request, call_next):
        response = await call_next(request)
        for key, value in SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response

    # -- routes -----------------------------------------------------------------------------

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz():
        return "ok"

    @app.get("/")
    def index():
        return RedirectResponse("/queue", status_code=303)

    @app.get("/login")
    def login_form(request: Request, next: str = "/queue"):
        token = secrets.token_hex(16)
        resp = render("login.html", reviewer=None, csrf=None, login_csrf=token, error=None,
                      next=_local(next))
        _set_cookie(request, resp, LOGIN_CSRF_COOKIE, token, 600)
        return resp

    @app.post("/login")
    def login(request: Request, token: str = Form(""), login_csrf: str = Form(""),
              next: str = Form("/queue")):
        cookie = request.cookies.get(LOGIN_CSRF_COOKIE, "")
        if not cookie or not hmac.compare_digest(cookie, login_csrf):
            raise HTTPProblem(403, "login form expired or forged (CSRF check failed); reload it")
        name = store.authenticate(token.strip())
        if name is None:
            fresh = secrets.token_hex(16)
            resp = render("login.html", 401, reviewer=None, csrf=None, login_csrf=fresh,
                          error="Token not recognised.", next=_local(next))
            _set_cookie(request, resp, LOGIN_CSRF_COOKIE, fresh, 600)
            return resp
        resp = RedirectResponse(_local(next), status_code=303)
        _set_cookie(request, resp, SESSION_COOKIE, make_session(name), session_seconds)
        resp.delete_cookie(LOGIN_CSRF_COOKIE)
        return resp

    @app.post("/logout")
    def logout(request: Request, csrf_token: str = Form("")):
        require_post(request, csrf_token)
        resp = RedirectResponse("/login", status_code=303)
        resp.delete_cookie(SESSION_COOKIE)
        return resp

    @app.get("/queue")
    def queue(request: Request, state: str = "open", reason: str = "", target: str = "",
              page: int = 1, decided: int | None = None):
        name, csrf = require_page(request)
        if state not in (*STATES, "open", "all"):
            raise HTTPProblem(400, f"unknown state filter {state!r}")
        per_page = 50
        rows = store.list(None if state == "all" else state, reason=reason or None,
                          target=target or None, limit=per_page + 1,
                          offset=(max(page, 1) - 1) * per_page)
        notice = None
        if decided is not None:
            try:
                done = store.get(decided)
                notice = f"Item {done['id']} ({done['target']}) {done['state']}."
            except ItemNotFound:
                pass
        return render("queue.html", reviewer=name, csrf=csrf, items=rows[:per_page],
                      more=len(rows) > per_page, page=max(page, 1), state=state, reason=reason,
                      target=target, states=[*STATES, "open", "all"], notice=notice)

    @app.get("/items/{item_id}")
    def item_page(request: Request, item_id: int):
        name, csrf = require_page(request)
        item = store.get(item_id)
        plddt = item["scores"].get("plddt") or []
        now = time.time()
        claimable = item["state"] == "pending" or (item["state"] == "claimed" and (
            item["claimed_by"] == name or (item["lease_expires_at"] or 0) <= now))
        return render("item.html", reviewer=name, csrf=csrf, item=item, plot=plddt_plot(plddt),
                      events=store.events(item_id), final=item["state"] in FINAL_STATES,
                      claimable=claimable, actions=list(ACTIONS))

    @app.get("/items/{item_id}/files/{kind}")
    def item_file(request: Request, item_id: int, kind: str):
        require_page(request)
        path = store.get(item_id)["paths"].get(kind)
        if path is None or not Path(path).is_file():
            raise HTTPProblem(404, f"item {item_id} has no {kind} file on this server")
        return FileResponse(path, media_type="text/plain; charset=utf-8",
                            filename=Path(path).name, content_disposition_type="attachment")

    @app.post("/items/{item_id}/claim")
    def claim(request: Request, item_id: int, csrf_token: str = Form(""),
              lease_seconds: float = Form(900)):
        name = require_post(request, csrf_token)
        store.claim(name, lease_seconds, item_id=item_id)
        return RedirectResponse(f"/items/{item_id}", status_code=303)

    @app.post("/items/{item_id}/decide")
    def decide(request: Request, item_id: int, csrf_token: str = Form(""),
               action: str = Form(""), comment: str = Form("")):
        name = require_post(request, csrf_token)
        store.decide(item_id, name, action, comment)
        return RedirectResponse(f"/queue?decided={item_id}", status_code=303)

    @app.get("/export")
    def export(request: Request, format: str = "jsonl"):
        require_page(request)
        if format not in EXPORT_FORMATS:
            raise HTTPProblem(400, f"format must be one of {EXPORT_FORMATS}")
        media = "application/x-ndjson" if format == "jsonl" else "text/csv"
        return Response(store.export(format), media_type=f"{media}; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="review_decisions.{format}"'})

    return app


def _local(path: str) -> str:
    """Only same-site redirect targets (no open redirect via ?next=)."""
    return path if path.startswith("/") and not path.startswith("//") and "\\" not in path \
        else "/queue"


def _set_cookie(request: Request, resp: Response, key: str, value: str, max_age: int) -> None:
    resp.set_cookie(key, value, max_age=max_age, httponly=True, samesite="strict",
                    secure=request.url.scheme == "https")


def serve(queue_url: str, *, host: str = "127.0.0.1", port: int = 8765) -> int:
    """`protdp review serve`: run the UI with uvicorn (secret from env PROTDP_REVIEW_SECRET)."""
    import uvicorn

    env_secret = os.environ.get("PROTDP_REVIEW_SECRET")
    app = create_app(queue_url, secret=env_secret.encode() if env_secret else None)
    print(f"protdp review UI: http://{host}:{port}/  (log in with a reviewer token; "
          "add one with `protdp review add-reviewer NAME`)", flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print("warning: serving plain HTTP beyond localhost; put it behind a TLS reverse proxy "
              "so tokens and session cookies are not sent in the clear", file=sys.stderr)
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0
