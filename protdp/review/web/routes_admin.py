"""Admin pages (an admin's session or bearer token): reviewers, held claims, limits."""

from __future__ import annotations

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse

from protdp.review.hygiene import int_in_range
from protdp.review.schema import ID_MAX
from protdp.review.web.auth import HTTPProblem, acting_admin, require_page, require_post

router = APIRouter()


def _admin_page(request: Request, who, *, status: int = 200, new_token=None, notice=None):
    store = request.app.state.store
    return request.app.state.render(
        "admin.html", status, viewer=who, reviewers=store.reviewers(),
        held=store.list("claimed", limit=10_000), limits=store.limits(), new_token=new_token,
        notice=notice)


@router.get("/admin")
def admin_page(request: Request):
    who = require_page(request)
    if not who.is_admin:
        raise HTTPProblem(403, f"'{who.name}' is not an admin")
    return _admin_page(request, who)


@router.post("/admin/reviewers")
def add_reviewer(request: Request, csrf_token: str = Form(""), name: str = Form(""),
                 admin: str = Form("")):
    who = require_post(request, csrf_token, admin=True)
    token = acting_admin(request, who).add_reviewer(name.strip(), admin=admin == "on")
    return _admin_page(request, who, new_token=(name.strip(), token))


@router.post("/admin/reviewers/remove")
def remove_reviewer(request: Request, csrf_token: str = Form(""), name: str = Form("")):
    who = require_post(request, csrf_token, admin=True)
    released = acting_admin(request, who).remove_reviewer(name)
    return _admin_page(request, who, notice=f"Removed {name}; {released} claim(s) released.")


@router.post("/admin/release")
def release(request: Request, csrf_token: str = Form(""), item_id: str = Form(""),
            reviewer: str = Form("")):
    who = require_post(request, csrf_token, admin=True)
    adm = acting_admin(request, who)
    if item_id:
        adm.release(item_id=int_in_range(item_id, "item id", 1, ID_MAX))
    else:
        adm.release(reviewer=reviewer)
    return RedirectResponse("/admin", status_code=303)
