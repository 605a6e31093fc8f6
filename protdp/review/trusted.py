"""What may leave the queue as training signal: decisions that survive `verify` and whose
files are still the bytes the reviewer saw.

`trusted_records(store, admin_token)` is the one door through which self-distillation export
(`protdp review export --format store`) and `protdp calibrate --from-reviews` read decisions:
it needs an admin token, runs `verify` first (a problem that names no item, e.g. a broken
chain or an unreadable audit key, refuses everything), and refuses, naming why, every item that
`verify` names, that a newer prediction superseded, or whose files changed since enqueue
(`protdp.review.binding`; with `require_bytes` also an item with no recorded file digests).
"""

from __future__ import annotations

from protdp.review.binding import mismatches
from protdp.review.errors import AuthError, QueueError

_CHANGED = ("changed since enqueue", "gone since enqueue", "appeared after enqueue",
            "checkpoint digest")


def trusted_records(store, admin_token: str | None, *, require_bytes: bool
                    ) -> tuple[list[dict], list[dict]]:
    """(records fit to use, [{"item_id", "reason"}] refused) of the decided items."""
    if not admin_token:
        raise AuthError("reading reviewed decisions as training signal needs the queue's admin "
                        "token: set PROTDP_REVIEW_ADMIN_TOKEN (or pass --admin-token)")
    store.admin(admin_token)                      # AuthError unless an admin token
    report = store.verify(files=False)           # the chain; files: `mismatches` below
    if report["whole_log_suspect"]:
        shown = "; ".join(report["problems"][:3])
        raise QueueError(f"`protdp review verify` fails for the whole audit log ({shown}); "
                         "nothing is exported until an administrator resolves it")
    bad = set(report["bad_items"])
    first_problem = {}
    for problem in report["problems"]:
        for item_id in bad:
            if f"item {item_id}" in problem:
                first_problem.setdefault(item_id, problem)
    kept, refused = [], []
    for rec in store.export_records():
        reasons = []
        if rec["item_id"] in bad:
            reasons.append("fails `protdp review verify`: "
                           + first_problem.get(rec["item_id"], "see verify"))
        if rec.get("superseded_by") is not None:
            reasons.append(f"superseded by item {rec['superseded_by']} (a newer prediction of "
                           "the same target)")
        problems = mismatches(rec)
        if not require_bytes:
            problems = [p for p in problems if any(c in p for c in _CHANGED)]
        elif rec["decision"] == "approved" and not rec.get("bound_sha256"):
            problems.append("the approval binds no content digest")
        reasons += problems
        if reasons:
            refused.append({"item_id": rec["item_id"], "decision": rec["decision"],
                            "reason": "; ".join(reasons)})
        else:
            kept.append(rec)
    return kept, refused
