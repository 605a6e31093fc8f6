"""The item workbench (3D view, sequence, plots, PAE, decision) and its actions and files."""

from __future__ import annotations

from fastapi import APIRouter, Form, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from protdp.errors import InputError
from protdp.review.binding import changed_files, served_bytes_match
from protdp.gating import AFDB_BAND_COLORS, AFDB_BANDS
from protdp.gating.bands import AFDB_BAND_FLOORS
from protdp.review.errors import ClaimConflict
from protdp.review.files import (STRUCTURE_KINDS, item_files, oversized, read_item_file,
                                 resolve_item_file)
from protdp.review.hygiene import int_in_range
from protdp.review.schema import ACTIONS, FINAL_STATES, ID_MAX
from protdp.review.web.auth import (HTTPProblem, Viewer, acting, opened, require_page,
                                   require_post)
from protdp.review.web.render import (complex_view, coverage_plot, pae_png, plddt_plot,
                                     residue_html)

router = APIRouter()


def band_scale() -> list:
    """[[floor, floor inclusive, colour], ...] highest band first (the 3D view's colours)."""
    return [[*AFDB_BAND_FLOORS[b], AFDB_BAND_COLORS[b]] for b in AFDB_BANDS]


def _id(item_id: str) -> int:
    return int_in_range(item_id, "item id", 1, ID_MAX)


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


def item_context(request: Request, who: Viewer, item_id: int) -> dict:
    """Everything the workbench template shows for item `item_id` (one read transaction)."""
    view = request.app.state.store.item_view(item_id)
    item, roots = view["item"], request.app.state.files_roots
    scores = item["scores"]
    plddt = scores.get("plddt") or []
    changed = changed_files(item)
    not_bound = {p.split(":")[0] for p in changed}          # kinds whose bytes changed
    files = {k: f"/items/{item['id']}/files/{k}" for k in item_files(item)
             if k not in not_bound and resolve_item_file(item, k, roots) is not None}
    limit = request.app.state.max_structure_bytes
    too_big = {k: oversized(resolve_item_file(item, k, roots), k, limit)
               for k in STRUCTURE_KINDS if k in files}
    structure = next(((k, files[k]) for k in STRUCTURE_KINDS
                      if k in files and not too_big[k]), None)
    coverage = scores.get("msa_coverage")
    mine = item["state"] == "claimed" and item["claimed_by"] == who.name
    cx = complex_view(scores)
    return dict(viewer=who, item=item, scores=scores, files=files, structure=structure,
                plot=plddt_plot(plddt),
                residues=residue_html(scores.get("sequence"), plddt, cx and cx["chains"]),
                coverage=coverage_plot(coverage, scores.get("msa_rows_used"))
                if isinstance(coverage, list) and coverage else None,
                has_pae="scores" in files and pae_png(resolve_item_file(item, "scores", roots))
                is not None, events=view["events"], final=item["state"] in FINAL_STATES,
                mine=mine, decidable=item["state"] == "pending" or mine, actions=list(ACTIONS),
                prev_id=view["prev_id"], next_id=view["next_id"], draft="", error=None,
                limits=view["limits"], band_scale=band_scale(), complex=cx,
                structure_too_big=max((v for v in too_big.values() if v), default=None),
                structure_limit=limit, changed=changed)


@router.get("/items/{item_id}")
def item_page(request: Request, item_id: str):
    who = require_page(request)
    ctx = item_context(request, who, _id(item_id))
    opened(request, who).add(ctx["item"]["id"])       # batch approval accepts only these
    return request.app.state.render("item.html", **ctx)


@router.get("/items/{item_id}/files/{kind}")
def item_file(request: Request, item_id: str, kind: str):
    """A file of the item's own prediction folder, inline with its content type; 404 for
    anything outside the folder (links followed first), absent, or not a structure/JSON."""
    require_page(request)
    item = request.app.state.store.get(_id(item_id))
    limit = request.app.state.max_structure_bytes
    size = oversized(resolve_item_file(item, kind, request.app.state.files_roots), kind, limit)
    if size:
        raise HTTPProblem(413, f"the {kind} file is {size / 2**20:.1f} MB, over this server's "
                               f"{limit / 2**20:g} MB limit for the 3D view")
    found = read_item_file(item, kind, request.app.state.files_roots, limit)
    if found is None:
        raise HTTPProblem(404, f"item {item['id']} has no {kind[:40]} file on this server")
    data, media, name = found
    if not served_bytes_match(item, kind, data):
        raise HTTPProblem(409, f"item {item['id']}: its {kind[:40]} file changed since it was "
                               "queued; not shown (it is not what the gate sent for review)")
    return Response(data, media_type=media, headers={
        "Content-Disposition": f'inline; filename="{name}"'})


@router.get("/items/{item_id}/pae.png")
def item_pae(request: Request, item_id: str):
    require_page(request)
    item = request.app.state.store.get(_id(item_id))
    found = read_item_file(item, "scores", request.app.state.files_roots)
    if found is not None and not served_bytes_match(item, "scores", found[0]):
        raise HTTPProblem(409, f"item {item['id']}: its scores file changed since it was "
                               "queued; its PAE is not shown")
    png = pae_png(resolve_item_file(item, "scores", request.app.state.files_roots))
    if png is None:
        raise HTTPProblem(404, f"item {item['id']} has no PAE (the model has no PAE head)")
    return Response(png, media_type="image/png")


def _after_lease(request: Request, item: dict):
    if _wants_json(request):
        return JSONResponse({"id": item["id"], "state": item["state"],
                             "claimed_by": item["claimed_by"],
                             "lease_remaining_s": item["lease_remaining_s"]})
    return RedirectResponse(f"/items/{item['id']}", status_code=303)


@router.post("/items/{item_id}/claim")
def claim(request: Request, item_id: str, csrf_token: str = Form("")):
    """Claim (or, when you hold it, renew) with the server's default lease."""
    who = require_post(request, csrf_token)
    return _after_lease(request, acting(request, who).claim(_id(item_id)))


@router.post("/items/{item_id}/renew")
def renew(request: Request, item_id: str, csrf_token: str = Form("")):
    who = require_post(request, csrf_token)
    rev = acting(request, who)
    item = request.app.state.store.get(_id(item_id))
    if item["claimed_by"] != who.name:
        raise HTTPProblem(409, f"item {item['id']} is not held by you (lease over?); claim it")
    return _after_lease(request, rev.claim(item["id"]))


@router.post("/items/{item_id}/release")
def release(request: Request, item_id: str, csrf_token: str = Form("")):
    who = require_post(request, csrf_token)
    acting(request, who).release(_id(item_id))
    return RedirectResponse("/queue", status_code=303)


@router.post("/items/{item_id}/decide")
def decide(request: Request, item_id: str, csrf_token: str = Form(""), action: str = Form(""),
           comment: str = Form("")):
    """Decide; on a refusal the item page comes back with the typed comment kept."""
    who = require_post(request, csrf_token)
    item_n = _id(item_id)
    try:
        changed = changed_files(request.app.state.store.get(item_n)) \
            if action == "approve" else []
        if changed:
            raise InputError(f"cannot approve item {item_n}: its files are not the bytes queued "
                             f"for review ({'; '.join(changed[:3])}); reject or escalate it and "
                             "re-predict", field="action")
        acting(request, who).decide(item_n, action, comment)
    except (InputError, ClaimConflict) as exc:
        status = 400 if isinstance(exc, InputError) else 409
        if _wants_json(request):
            raise HTTPProblem(status, str(exc)) from None
        ctx = item_context(request, who, item_n)
        ctx.update(draft=comment, error=str(exc))
        return request.app.state.render("item.html", status, **ctx)
    return RedirectResponse(f"/queue?decided={item_n}", status_code=303)
