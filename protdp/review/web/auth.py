"""Who is asking: server-side sessions (cookie), bearer tokens, CSRF; login and logout.

- Login exchanges a reviewer token for a random session token kept server-side (only its
  SHA-256 is stored), sent as an HttpOnly, SameSite=Strict cookie. Logout, expiry (database
  time) and removal of the reviewer end the session for every copy of the cookie.
- API clients may send `Authorization: Bearer <reviewer token>` instead (no cookie, no CSRF).
- Every POST is authenticated (401) and, for cookie sessions, carries the session's CSRF token
  (403 when missing or wrong). The login form uses a double-submit cookie.
- Failed logins are rate-limited per client address (`LOGIN_FAILURES` in `LOGIN_WINDOW_S`,
  then 429 until the window passes); logout answers `Clear-Site-Data: "storage"` so comment
  drafts never outlive the session in a shared browser (review.js clears them as well).
- `opened(request)` is the set of items this session has opened (the item page); batch
  approval accepts only those (routes_queue).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from protdp.review.actions import Admin, Reviewer
from protdp.review.errors import AuthError

SESSION_COOKIE = "protdp_session"
LOGIN_CSRF_COOKIE = "protdp_login_csrf"

LOGIN_FAILURES = 10                  # failed logins per client address per window
LOGIN_WINDOW_S = 300.0

router = APIRouter()
_lock = threading.Lock()


def _failures(request: Request) -> list[float]:
    """Recent failed-login times of this client (app state, pruned to the window)."""
    table = request.app.state.__dict__.setdefault("_login_failures", {})
    host = request.client.host if request.client else "?"
    now = time.monotonic()
    recent = [t for t in table.get(host, []) if now - t < LOGIN_WINDOW_S]
    table[host] = recent
    return recent


def opened(request: Request, who: "Viewer") -> set[int]:
    """Item ids this session (or bearer token) has opened on the item page."""
    table = request.app.state.__dict__.setdefault("_opened", {})
    key = who.session or who.token or ""
    with _lock:
        return table.setdefault(hashlib.sha256(key.encode()).hexdigest(), set())


class HTTPProblem(Exception):
    """An error page with a status code (303 means: redirect to `message`)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Viewer:
    """The authenticated reviewer of a request: csrf is None for bearer-token clients."""

    name: str
    is_admin: bool
    csrf: str | None
    session: str | None
    token: str | None


def viewer(request: Request) -> Viewer | None:
    """The reviewer behind a request; a bad bearer token is a 401, no credentials None."""
    store = request.app.state.store
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            raise HTTPProblem(401, "invalid reviewer token")
        try:
            rev = store.reviewer(token.strip())
        except AuthError:
            raise HTTPProblem(401, "invalid reviewer token") from None
        return Viewer(rev.name, rev.is_admin, None, None, token.strip())
    cookie = request.cookies.get(SESSION_COOKIE)
    principal = store.session(cookie)
    if principal is None:
        return None
    return Viewer(principal.name, principal.is_admin, principal.csrf, cookie, None)


def require_page(request: Request) -> Viewer:
    who = viewer(request)
    if who is None:
        raise HTTPProblem(303, "/login?" + urlencode({"next": request.url.path}))
    return who


def require_post(request: Request, csrf_token: str, *, admin: bool = False) -> Viewer:
    """The reviewer behind a mutating request: 401 without credentials, 403 on bad CSRF."""
    who = viewer(request)
    if who is None:
        raise HTTPProblem(401, "log in with a reviewer token first")
    if who.csrf is not None and not hmac.compare_digest(csrf_token or "", who.csrf):
        raise HTTPProblem(403, "form expired or forged (CSRF check failed); reload the page")
    if admin and not who.is_admin:
        raise HTTPProblem(403, f"'{who.name}' is not an admin")
    return who


def acting(request: Request, who: Viewer) -> Reviewer:
    """The store's Reviewer for this request's credential (re-checked in each transaction)."""
    store, checked = request.app.state.store, (who.name, who.is_admin)
    if who.token:
        return store.reviewer(who.token, checked=checked)
    return store.reviewer(session=who.session, checked=checked)


def acting_admin(request: Request, who: Viewer) -> Admin:
    store = request.app.state.store
    return store.admin(who.token) if who.token else store.admin(session=who.session)


def local(path: str) -> str:
    """Only same-site redirect targets (no open redirect via ?next=)."""
    ok = path.startswith("/") and not path.startswith("//") and "\\" not in path \
        and all(c.isprintable() for c in path)
    return path if ok else "/queue"


def set_cookie(request: Request, resp: Response, key: str, value: str, max_age: int) -> None:
    resp.set_cookie(key, value, max_age=max_age, httponly=True, samesite="strict",
                    secure=request.url.scheme == "https")


def _login_page(request: Request, status: int, error: str | None, next_path: str) -> Response:
    token = secrets.token_hex(16)
    resp = request.app.state.render("login.html", status, viewer=None, login_csrf=token,
                                    error=error, next=local(next_path))
    set_cookie(request, resp, LOGIN_CSRF_COOKIE, token, 600)
    return resp


@router.get("/login")
def login_form(request: Request, next: str = "/queue"):
    return _login_page(request, 200, None, next)


@router.post("/login")
def login(request: Request, token: str = Form(""), login_csrf: str = Form(""),
          next: str = Form("/queue")):
    cookie = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not cookie or not hmac.compare_digest(cookie, login_csrf):
        raise HTTPProblem(403, "login form expired or forged (CSRF check failed); reload it")
    seconds = request.app.state.session_seconds
    with _lock:
        if len(_failures(request)) >= LOGIN_FAILURES:
            raise HTTPProblem(429, f"too many failed logins from this address; wait "
                                   f"{LOGIN_WINDOW_S / 60:g} minutes")
    try:
        session, _ = request.app.state.store.login(token.strip(), seconds)
    except AuthError:
        with _lock:
            _failures(request).append(time.monotonic())
        return _login_page(request, 401, "Token not recognised.", next)
    resp = RedirectResponse(local(next), status_code=303)
    set_cookie(request, resp, SESSION_COOKIE, session, max(0, int(seconds)))
    resp.delete_cookie(LOGIN_CSRF_COOKIE)
    return resp


@router.post("/logout")
def logout(request: Request, csrf_token: str = Form("")):
    who = require_post(request, csrf_token)
    if who.session:
        request.app.state.store.logout(who.session)  # server-side: a replayed cookie is dead
    resp = RedirectResponse("/login?logged_out=1", status_code=303)
    resp.delete_cookie(SESSION_COOKIE)
    resp.headers["Clear-Site-Data"] = '"storage"'     # comment drafts go with the session
    with _lock:
        request.app.state.__dict__.get("_opened", {}).pop(
            hashlib.sha256((who.session or who.token or "").encode()).hexdigest(), None)
    return resp
