"""The queue page (filters, sorting, totals, selection), claim-next, batch decisions, export."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from protdp.gating import REASON_TEXT
from protdp.review.binding import changed_files
from protdp.review.errors import ItemNotFound
from protdp.review.hygiene import check_filter_text, int_in_range
from protdp.review.schema import ID_MAX, STATES
from protdp.review.store import EXPORT_FORMATS, SORT_KEYS
from protdp.review.web.auth import HTTPProblem, acting, opened, require_page, require_post

router = APIRouter()
PER_PAGE = 50
MAX_PAGE = 1_000_000
STATE_FILTERS = (*STATES, "open", "all")


def queue_filters(state: str, reason: str, target: str, sort: str, order: str) -> dict:
    """Validated queue filters (400 on anything unknown)."""
    if state not in STATE_FILTERS:
        raise HTTPProblem(400, f"unknown state filter {state[:40]!r}")
    if reason and reason not in REASON_TEXT:
        raise HTTPProblem(400, f"unknown reason code {reason[:40]!r}")
    if sort not in SORT_KEYS or order not in ("asc", "desc"):
        raise HTTPProblem(400, f"sort must be one of {list(SORT_KEYS)} with dir asc or desc")
    return {"state": state, "reason": reason, "target": check_filter_text(target, "target") or "",
            "sort": sort, "dir": order}


@router.get("/queue")
def queue(request: Request, state: str = "open", reason: str = "", target: str = "",
          sort: str = "id", dir: str = "asc", page: str = "1", decided: str = "",
          empty: str = ""):
    who = require_page(request)
    store = request.app.state.store
    f = queue_filters(state, reason, target, sort, dir)
    page_n = int_in_range(page, "page", 1, MAX_PAGE)
    rows = store.list(None if state == "all" else state, reason=f["reason"] or None,
                      target=f["target"] or None, limit=PER_PAGE + 1,
                      offset=(page_n - 1) * PER_PAGE, sort=sort, descending=dir == "desc")
    matching = store.count(None if state == "all" else state, reason=f["reason"] or None,
                           target=f["target"] or None)
    notice = None
    if decided:
        done = store.get(int_in_range(decided, "decided", 1, ID_MAX))
        notice = f"Item {done['id']} ({done['target']}) {done['state']}."
    elif empty:
        notice = "Nothing left to claim: every open item is held by someone."

    def link(**changes) -> str:
        return "/queue?" + urlencode({**f, "page": page_n, **changes})

    return request.app.state.render(
        "queue.html", viewer=who, items=rows[:PER_PAGE], more=len(rows) > PER_PAGE, page=page_n,
        per_page=PER_PAGE, matching=matching, totals=store.stats()["by_state"], notice=notice,
        states=STATE_FILTERS, sort_keys=SORT_KEYS, link=link, held=store.held_by(who.name),
        limits=store.limits(), **f)


@router.post("/queue/claim-next")
def claim_next(request: Request, csrf_token: str = Form("")):
    """Lease the oldest item nobody holds (skips others' live claims; no collisions)."""
    who = require_post(request, csrf_token)
    item = acting(request, who).claim()
    if item is None:
        return RedirectResponse("/queue?empty=1", status_code=303)
    return RedirectResponse(f"/items/{item['id']}", status_code=303)


@router.post("/queue/batch")
def batch(request: Request, csrf_token: str = Form(""), ids: list[str] = Form([]),
          action: str = Form("approve"), comment: str = Form(""),
          confirm_count: str = Form("")):
    """One decision and one comment for a selection; per-item outcome shown. Approval takes
    only items this session has opened, and the reviewer must confirm how many."""
    who = require_post(request, csrf_token)
    item_ids = list(dict.fromkeys(int_in_range(i, "ids", 1, ID_MAX) for i in ids))
    results: dict[int, str] = {}
    if action == "approve":
        if confirm_count.strip() != str(len(item_ids)):
            raise HTTPProblem(400, f"confirm the number of items to approve: type "
                                   f"{len(item_ids)} (you selected {len(item_ids)})")
        seen = opened(request, who)
        results = {i: "not approved: you have not opened this item in this session"
                   for i in item_ids if i not in seen}
        item_ids = [i for i in item_ids if i in seen]
        for i in list(item_ids):
            try:
                changed = changed_files(request.app.state.store.get(i))
            except ItemNotFound:
                continue                       # decide_many names it
            if changed:
                results[i] = f"not approved: its files changed since it was queued ({changed[0]})"
                item_ids.remove(i)
    if item_ids or not results:
        results.update(acting(request, who).decide_many(item_ids, action, comment))
    return request.app.state.render("batch.html", viewer=who, results=results, action=action,
                                    comment=comment)


@router.get("/export")
def export(request: Request, format: str = "jsonl"):
    require_page(request)
    if format not in EXPORT_FORMATS:
        raise HTTPProblem(400, f"format must be one of {EXPORT_FORMATS}")
    media = "application/x-ndjson" if format == "jsonl" else "text/csv"
    return Response(request.app.state.store.export(format), media_type=f"{media}; charset=utf-8",
                    headers={"Content-Disposition":
                             f'attachment; filename="review_decisions.{format}"'})
