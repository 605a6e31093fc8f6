"""`protdp review ...`: reviewers, claims, decisions, exports and the web UI.

The queue is chosen with `--queue-url` (env PROTDP_QUEUE_URL; default a SQLite file
`review_queue.sqlite` in the working directory; `postgresql://...` for a shared server).
Commands that decide need the reviewer's token: env PROTDP_REVIEW_TOKEN (preferred: it does not
show up in `ps`) or `--token`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from protdp.errors import InputError
from protdp.gating import AFDB_BAND_LABELS, REASON_TEXT, band_of
from protdp.review.store import (DEFAULT_QUEUE_URL, EXPORT_FORMATS, STATES, QueueError,
                                 ReviewStore, iso)


def _safe(text) -> str:
    """User-controlled text for a terminal: control characters (escape sequences) made visible."""
    s = "" if text is None else str(text)
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in s)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--queue-url", default=os.environ.get("PROTDP_QUEUE_URL", DEFAULT_QUEUE_URL),
                        help="SQLite path/URL or postgresql://user:pw@host/db "
                             "(env PROTDP_QUEUE_URL; default %(default)s)")
    auth = argparse.ArgumentParser(add_help=False)
    auth.add_argument("--token", default=None,
                      help="reviewer token (prefer env PROTDP_REVIEW_TOKEN)")

    p = argparse.ArgumentParser(prog="protdp review", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("add-reviewer", parents=[common], help="create a reviewer; prints its token once")
    s.add_argument("name")
    s = sub.add_parser("remove-reviewer", parents=[common], help="revoke a reviewer's token")
    s.add_argument("name")

    s = sub.add_parser("list", parents=[common], help="list items (default: open ones)")
    s.add_argument("--state", default="open", choices=[*STATES, "open", "all"])
    s.add_argument("--reason", choices=sorted(REASON_TEXT), default=None)
    s.add_argument("--target", default=None, help="substring of the target name")
    s.add_argument("--limit", type=int, default=100)
    s.add_argument("--json", action="store_true", help="one JSON object per line")

    s = sub.add_parser("show", parents=[common], help="one item with its reasons and audit trail")
    s.add_argument("id", type=int)
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("claim", parents=[common, auth], help="lease the next pending item")
    s.add_argument("--lease", type=float, default=900, help="lease in seconds (%(default)s)")
    s.add_argument("--item", type=int, default=None, help="claim this item instead of the next")

    for action, verb in (("approve", "approve"), ("reject", "reject"), ("escalate", "escalate")):
        s = sub.add_parser(action, parents=[common, auth], help=f"{verb} an item")
        s.add_argument("id", type=int)
        s.add_argument("--comment", "-m", default="", required=action != "approve",
                       help="why (required to reject or escalate)")

    s = sub.add_parser("export", parents=[common], help="decisions with their audit trail")
    s.add_argument("--format", choices=EXPORT_FORMATS, default="jsonl")
    s.add_argument("--out", type=Path, default=None, help="file to write (default stdout)")

    s = sub.add_parser("stats", parents=[common], help="counts by state and reviewer")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("serve", parents=[common], help="run the reviewer web UI")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8765)
    return p


def _reviewer(store: ReviewStore, args) -> str:
    token = args.token or os.environ.get("PROTDP_REVIEW_TOKEN")
    if not token:
        raise QueueError("no reviewer token: set PROTDP_REVIEW_TOKEN (or pass --token)")
    name = store.authenticate(token)
    if name is None:
        raise QueueError("reviewer token not recognised (or the reviewer was removed)")
    return name


def _line(item: dict) -> str:
    mean = item["mean_plddt"]
    mean_s = "   -" if mean is None else f"{mean:5.1f}"
    who = f" ({_safe(item['claimed_by'] or item['decided_by'])})" \
        if item["claimed_by"] or item["decided_by"] else ""
    return (f"{item['id']:>6}  {item['state'] + who:<22} {mean_s}  "
            f"{','.join(item['reasons']):<40} {_safe(item['target'])}")


def _show(store: ReviewStore, item: dict) -> None:
    mean = item["mean_plddt"]
    print(f"item {item['id']}: {_safe(item['target'])}  [{item['state']}]")
    print(f"  prediction: {_safe(item['prediction_id'])}")
    if mean is not None:
        print(f"  mean pLDDT: {mean:.1f}  ({AFDB_BAND_LABELS[band_of(mean)]})")
    for band, frac in (item["scores"].get("afdb_bands") or {}).items():
        print(f"    {AFDB_BAND_LABELS.get(band, band):<30} {frac:6.1%}")
    for code in item["reasons"]:
        detail = item["details"].get(code)
        print(f"  reason: {code}: {REASON_TEXT.get(code, '')}" + (f" ({_safe(detail)})" if detail else ""))
    for kind, path in item["paths"].items():
        print(f"  {kind}: {_safe(path)}")
    if item["claimed_by"]:
        print(f"  claimed by {_safe(item['claimed_by'])} until {iso(item['lease_expires_at'])}")
    print("  audit trail:")
    for ev in store.events(item["id"]):
        comment = f": {_safe(ev['comment'])}" if ev["comment"] else ""
        print(f"    {iso(ev['at'])}  {_safe(ev['actor'])}  {ev['action']}{comment}")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "serve":
        from protdp.review.web import serve
        return serve(args.queue_url, host=args.host, port=args.port)
    store = ReviewStore(args.queue_url)
    try:
        return _run(store, args)
    finally:
        store.close()


def _run(store: ReviewStore, args) -> int:
    if args.cmd == "add-reviewer":
        token = store.add_reviewer(args.name)
        print(f"reviewer '{args.name}' created. Token (shown once, store it safely):", file=sys.stderr)
        print(token)
    elif args.cmd == "remove-reviewer":
        store.deactivate_reviewer(args.name)
        print(f"reviewer '{args.name}' removed; their token no longer works")
    elif args.cmd == "list":
        if args.limit < 1:
            raise InputError(f"must be >= 1, got {args.limit}", field="--limit")
        found = store.list(None if args.state == "all" else args.state, reason=args.reason,
                           target=args.target, limit=args.limit)
        for item in found:
            print(json.dumps(item, sort_keys=True) if args.json else _line(item))
        if not args.json:
            print(f"{len(found)} item(s)", file=sys.stderr)
    elif args.cmd == "show":
        item = store.get(args.id)
        if args.json:
            print(json.dumps({**item, "events": store.events(args.id)}, sort_keys=True))
        else:
            _show(store, item)
    elif args.cmd == "claim":
        item = store.claim(_reviewer(store, args), args.lease, item_id=args.item)
        if item is None:
            print("no pending items")
        else:
            print(f"claimed item {item['id']} until {iso(item['lease_expires_at'])}")
            _show(store, item)
    elif args.cmd in ("approve", "reject", "escalate"):
        item = store.decide(args.id, _reviewer(store, args), args.cmd, args.comment)
        print(f"item {item['id']} {item['state']} by {item['decided_by']}")
    elif args.cmd == "export":
        data = store.export(args.format)
        if args.out is None:
            sys.stdout.write(data)
        else:
            args.out.write_text(data)
            print(f"wrote {args.format} export to {args.out}", file=sys.stderr)
    elif args.cmd == "stats":
        stats = store.stats()
        if args.json:
            print(json.dumps(stats, sort_keys=True))
        else:
            print(f"total {stats['total']}: " + ", ".join(f"{k} {v}" for k, v in stats["by_state"].items()))
            for who, counts in sorted(stats["by_reviewer"].items()):
                print(f"  {_safe(who)}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
            if stats["oldest_pending_age_s"] is not None:
                print(f"oldest pending item waiting {stats['oldest_pending_age_s']:.0f} s")
    return 0
