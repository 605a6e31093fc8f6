"""`create_app`: the review UI over a queue, and `serve` for `protdp review serve`."""

from __future__ import annotations

import sys
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse,
                               Response)
from fastapi.staticfiles import StaticFiles

from protdp.errors import InputError
from protdp.gating import AFDB_BAND_COLORS
from protdp.review.errors import AuthError, ClaimConflict, ItemNotFound, QueueBusy, QueueError
from protdp.review.files import MAX_STRUCTURE_BYTES
from protdp.review.store import SESSION_SECONDS, ReviewStore
from protdp.review.web import routes_admin, routes_items, routes_queue
from protdp.review.web.auth import HTTPProblem
from protdp.review.web.auth import router as auth_router
from protdp.review.web.limits import body_refusal
from protdp.review.web.render import HERE, make_env

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_STATUS = ((ItemNotFound, 404), (ClaimConflict, 409), (AuthError, 401), (QueueBusy, 503),
           (InputError, 400), (QueueError, 400))


def _problem(request: Request, exc: HTTPProblem):
    if exc.status == 303:
        return RedirectResponse(exc.message, status_code=303)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
    if exc.status == 503:
        headers["Retry-After"] = "5"
    if "application/json" in request.headers.get("accept", ""):
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)
    resp = request.app.state.render("error.html", exc.status, viewer=None, message=exc.message,
                                    status=exc.status)
    resp.headers.update(headers)
    return resp


def _install_error_pages(app: FastAPI) -> None:
    app.add_exception_handler(HTTPProblem, _problem)
    for exc_type, status in _STATUS:
        app.add_exception_handler(exc_type, lambda request, exc, status=status: _problem(
            request, HTTPProblem(status, str(exc))))

    def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
        return _problem(request, HTTPProblem(400, f"bad parameter {where}: "
                                                  f"{first.get('msg', 'invalid')}"))

    app.add_exception_handler(RequestValidationError, _invalid)


def create_app(store: ReviewStore | str, *, secret: bytes | None = None,
               session_seconds: int = SESSION_SECONDS,
               files_roots: list[str | Path] | None = None,
               max_structure_bytes: int = MAX_STRUCTURE_BYTES) -> FastAPI:
    """The review UI over `store` (a ReviewStore or its URL). Sessions live in the queue
    database (`secret` is accepted for compatibility and unused). Files are served only under
    the queue's roots (`protdp.review.roots`); `files_roots`, when given, narrows them."""
    del secret
    store = ReviewStore(store) if isinstance(store, str) else store
    env = make_env()
    app = FastAPI(title="protdp review", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = store
    app.state.session_seconds = session_seconds
    app.state.max_structure_bytes = int(max_structure_bytes)
    # the queue's roots, fixed at init-db; the server's own --files-root narrows them
    queue_roots = store.files_roots()
    app.state.files_roots = queue_roots if files_roots is None else [
        Path(r).resolve() for r in files_roots
        if any(Path(r).resolve().is_relative_to(q.resolve()) for q in queue_roots)]

    def render(template: str, http_status: int = 200, **ctx) -> HTMLResponse:
        return HTMLResponse(env.get_template(template).render(**ctx), status_code=http_status)

    app.state.render = render
    _install_error_pages(app)

    @app.middleware("http")
    async def _body_limit(request: Request, call_next):      # issue 47: no hanging on a lie
        refused = body_refusal(request.headers)
        if refused:
            return PlainTextResponse(refused[1], status_code=refused[0],
                                     headers={"Connection": "close"})
        return await call_next(request)

    @app.middleware("http")
    async def _headers(request: Request, call_next):
        response = await call_next(request)
        for key, value in SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response

    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_api_route("/healthz", lambda: PlainTextResponse("ok"), methods=["GET"])
    app.add_api_route("/", lambda: RedirectResponse("/queue", status_code=303), methods=["GET"])
    app.add_api_route("/favicon.ico", lambda: Response(status_code=204), methods=["GET"])
    app.add_api_route("/bands.css", lambda: Response(BANDS_CSS, media_type="text/css"),
                      methods=["GET"])
    for router in (auth_router, routes_queue.router, routes_items.router, routes_admin.router):
        app.include_router(router)
    return app


# the AFDB band colours, from their one definition (protdp.gating.bands)
BANDS_CSS = "".join(f".band-{b} {{ background: {c};{' color: #fff;' if b == 'very_high' else ''} }}\n"
                    for b, c in AFDB_BAND_COLORS.items())


def serve(queue_url: str, *, host: str = "127.0.0.1", port: int = 8765,
          files_roots: list[Path] | None = None,
          max_structure_bytes: int = MAX_STRUCTURE_BYTES) -> int:
    """`protdp review serve`: run the UI with uvicorn."""
    import uvicorn

    app = create_app(queue_url, files_roots=files_roots, max_structure_bytes=max_structure_bytes)
    print(f"protdp review UI: http://{host}:{port}/  (log in with a reviewer token; an admin "
          "adds one with `protdp review add-reviewer NAME`)", flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print("warning: serving plain HTTP beyond localhost; put it behind a TLS reverse proxy "
              "so tokens and session cookies are not sent in the clear", file=sys.stderr)
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0
