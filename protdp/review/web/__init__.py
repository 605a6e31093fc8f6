"""Reviewer web UI (FastAPI + Jinja2, server-rendered; small same-origin scripts for the 3D
view, shortcuts, lease countdown and drafts).

- `app`: `create_app` (wiring, error pages, security headers) and `serve` (uvicorn);
- `auth`: server-side sessions, bearer tokens, CSRF, login/logout;
- `render`: templates, display filters and the pure layout math of the plots;
- `routes_queue`, `routes_items`, `routes_admin`: the pages and actions.
"""

from protdp.review.web.app import create_app, serve
from protdp.review.web.auth import SESSION_COOKIE
from protdp.review.web.render import plddt_plot

__all__ = ["SESSION_COOKIE", "create_app", "plddt_plot", "serve"]
