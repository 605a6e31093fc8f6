"""`protdp review ...`: set up a queue, manage reviewers, claim and decide, export, verify,
and run the web UI.

The queue is chosen with `--queue-url` (env PROTDP_QUEUE_URL; default a SQLite file
`review_queue.sqlite` in the working directory; `postgresql://...` for a shared server).
Reviewer commands need the reviewer's token: env PROTDP_REVIEW_TOKEN (preferred: it does not
show up in `ps`) or `--token`. Admin commands (add-reviewer, remove-reviewer, release,
set-limits) need an admin token: env PROTDP_REVIEW_ADMIN_TOKEN or `--admin-token`;
`init-db` prints the first one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from protdp.errors import InputError
from protdp.gating import AFDB_BAND_LABELS, REASON_TEXT
from protdp.review.files import MAX_STRUCTURE_BYTES
from protdp.review.hygiene import display_text as _safe
from protdp.review.store import (DEFAULT_QUEUE_URL, EXPORT_FORMATS, STATES, AuthError,
                                 ReviewStore, iso)


def _tcp_port(text: str) -> int:
    """--port: a TCP port 1..65535 (argparse's one usage line; 99999 was an OverflowError)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)")
    return port


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--queue-url", default=os.environ.get("PROTDP_QUEUE_URL", DEFAULT_QUEUE_URL),
                        help="SQLite path/URL or postgresql://user:pw@host/db "
                             "(env PROTDP_QUEUE_URL; default %(default)s)")
    auth = argparse.ArgumentParser(add_help=False)
    auth.add_argument("--token", default=None,
                      help="reviewer token (prefer env PROTDP_REVIEW_TOKEN)")
    admin = argparse.ArgumentParser(add_help=False)
    admin.add_argument("--admin-token", default=None,
                       help="admin token (prefer env PROTDP_REVIEW_ADMIN_TOKEN)")

    p = argparse.ArgumentParser(prog="protdp review", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    _admin_commands(sub, common, admin)

    s = sub.add_parser("list", parents=[common], help="list items (default: open ones)")
    s.add_argument("--state", default="open", choices=[*STATES, "open", "all"])
    s.add_argument("--reason", choices=sorted(REASON_TEXT), default=None)
    s.add_argument("--target", default=None, help="substring of the target name")
    s.add_argument("--limit", type=int, default=100)
    s.add_argument("--json", action="store_true", help="one JSON object per line")

    s = sub.add_parser("show", parents=[common], help="one item with its reasons and audit trail")
    s.add_argument("id", type=int)
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("claim", parents=[common, auth],
                       help="lease the next item nobody holds (or --item; yours: renew)")
    s.add_argument("--lease", type=float, default=None,
                   help="lease in seconds (default and maximum: the server's limits)")
    s.add_argument("--item", type=int, default=None, help="claim this item instead of the next")

    for action in ("approve", "reject", "escalate"):
        s = sub.add_parser(action, parents=[common, auth], help=f"{action} an item")
        s.add_argument("id", type=int)
        s.add_argument("--comment", "-m", default="", required=action != "approve",
                       help="why (required to reject or escalate)")

    s = sub.add_parser("export", parents=[common, admin], help="decisions with their audit trail, or "
                                                        "approved predictions as training data")
    s.add_argument("--format", choices=EXPORT_FORMATS + ("store",), default="jsonl",
                   help="jsonl / csv: decisions; store: approved predictions as an HDF5 family "
                        "store for self-distillation (needs --out)")
    s.add_argument("--out", type=Path, default=None, help="file to write (default stdout)")
    s.add_argument("--force", action="store_true", help="replace an existing file of another kind")
    s.add_argument("--min-residue-plddt", type=float, default=0.0,
                   help="store: mask residues predicted below this pLDDT (default: keep all)")

    s = sub.add_parser("stats", parents=[common], help="counts by state and reviewer")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("verify", parents=[common],
                       help="check the hash-chained audit log against items and reviewers, "
                            "and re-hash every file an item is bound to")
    s.add_argument("--expect-head", default=None, metavar="SEQ:HASH",
                   help="a head printed by an earlier verify: it must still be in the log")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("serve", parents=[common], help="run the reviewer web UI")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=_tcp_port, default=8765)
    s.add_argument("--files-root", action="append", type=Path, default=None,
                   help="serve prediction files only from folders under this root (repeatable; "
                        "narrows the queue's roots fixed at init-db)")
    s.add_argument("--max-structure-mb", type=float, default=MAX_STRUCTURE_BYTES / 2**20,
                   help="largest structure file sent to the 3D view (%(default)g MB)")
    return p


def _admin_commands(sub, common, admin) -> None:
    """Subcommands that set up the queue or need an admin token."""
    s = sub.add_parser("init-db", parents=[common],
                       help="create the schema; print the first admin token; PostgreSQL grants")
    s.add_argument("--admin-name", default="admin", help="name of the first admin (%(default)s)")
    s.add_argument("--app-role", default=None,
                   help="PostgreSQL role of the web server and reviewer CLI (no UPDATE/DELETE/"
                        "TRUNCATE on the audit log)")
    s.add_argument("--enqueue-role", default=None,
                   help="PostgreSQL role of `protdp predict` (may only enqueue)")
    s.add_argument("--files-root", action="append", type=Path, default=None,
                   help="prediction files of items must lie under this folder (repeatable; "
                        "fixed now; default for SQLite: the queue file's folder)")

    s = sub.add_parser("add-reviewer", parents=[common, admin],
                       help="create a reviewer; prints its token once (admin)")
    s.add_argument("name")
    s.add_argument("--admin", action="store_true", help="the new reviewer is an admin too")
    s = sub.add_parser("remove-reviewer", parents=[common, admin],
                       help="revoke a reviewer: token, sessions and claims (admin)")
    s.add_argument("name")
    s = sub.add_parser("release", parents=[common, admin],
                       help="return claims to pending: one item or all of a reviewer's (admin)")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--item", type=int, default=None)
    g.add_argument("--reviewer", default=None)
    s = sub.add_parser("set-limits", parents=[common, admin],
                       help="server lease/claim limits (admin)")
    s.add_argument("--default-lease", type=int, default=None, help="seconds")
    s.add_argument("--max-lease", type=int, default=None, help="seconds")
    s.add_argument("--max-claims", type=int, default=None, help="items one reviewer may hold")
    sub.add_parser("reviewers", parents=[common], help="list reviewers")


def _token(args, attr: str, env: str, what: str) -> str:
    token = getattr(args, attr) or os.environ.get(env)
    if not token:
        raise AuthError(f"no {what} token: set {env} (or pass --{attr.replace('_', '-')})")
    return token


def _line(item: dict) -> str:
    mean = item["mean_plddt"]
    mean_s = "   -" if mean is None else f"{mean:5.1f}"
    who = item["claimed_by"] or item["decided_by"]
    state = item["state"] + (f" ({_safe(who)})" if who else "")
    return (f"{item['id']:>6}  {state:<22} {mean_s}  "
            f"{','.join(item['reasons']):<40} {_safe(item['target'])}")


def _show(store: ReviewStore, item: dict) -> None:
    mean = item["mean_plddt"]
    print(f"item {item['id']}: {_safe(item['target'])}  [{item['state']}]")
    print(f"  prediction: {_safe(item['prediction_id'])}")
    if mean is not None:
        band = item["band"]
        print(f"  mean pLDDT: {mean:.1f}  ({_safe(AFDB_BAND_LABELS.get(band, band))})")
    for band, frac in (item["scores"].get("afdb_bands") or {}).items():
        frac_s = f"{frac:6.1%}" if isinstance(frac, (int, float)) else _safe(frac)
        print(f"    {_safe(AFDB_BAND_LABELS.get(band, band)):<30} {frac_s}")
    for code in item["reasons"]:
        detail = item["details"].get(code)
        print(f"  reason: {code}: {REASON_TEXT.get(code, '')}" + (f" ({_safe(detail)})" if detail else ""))
    if item["folder"]:
        print(f"  folder: {_safe(item['folder'])}")
    for kind, name in item["paths"].items():
        print(f"  {_safe(kind)}: {_safe(name)}")
    if item["claimed_by"]:
        print(f"  claimed by {_safe(item['claimed_by'])} until {iso(item['lease_expires_at'])}")
    print("  audit trail:")
    for ev in store.events(item["id"]):
        comment = f": {_safe(ev['comment'])}" if ev["comment"] else ""
        print(f"    {iso(ev['at'])}  {_safe(ev['actor'])}  {_safe(ev['action'])}{comment}")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "serve":
        from protdp.review.web import serve
        return serve(args.queue_url, host=args.host, port=args.port, files_roots=args.files_root,
                     max_structure_bytes=int(args.max_structure_mb * 2**20))
    store = ReviewStore(args.queue_url, create=args.cmd == "init-db")   # only init-db creates
    try:
        handler = _ADMIN.get(args.cmd) or _REVIEWER.get(args.cmd) or _READ[args.cmd]
        return handler(store, args) or 0
    finally:
        store.close()


# -- admin ----------------------------------------------------------------------------------

def _init_db(store: ReviewStore, args) -> None:
    for role, kind in ((args.app_role, "app"), (args.enqueue_role, "enqueue")):
        if role:
            store.grant_role(role, kind)
            print(f"granted the {kind} privileges to PostgreSQL role '{role}'", file=sys.stderr)
    if args.files_root and not any(r["is_admin"] for r in store.reviewers()):
        roots = store.set_files_roots(args.files_root)
        print(f"file roots fixed: {', '.join(roots)}", file=sys.stderr)
    if any(r["is_admin"] for r in store.reviewers()):
        print(f"queue {store.safe_url} is ready (schema and admin already there)", file=sys.stderr)
        return
    token = store.init_admin(args.admin_name)
    print(f"queue {store.safe_url} is ready; admin '{args.admin_name}' created. Admin token "
          "(shown once; set PROTDP_REVIEW_ADMIN_TOKEN to use it):", file=sys.stderr)
    print(token)


def _admin(store: ReviewStore, args):
    return store.admin(_token(args, "admin_token", "PROTDP_REVIEW_ADMIN_TOKEN", "admin"))


def _add_reviewer(store, args) -> None:
    token = _admin(store, args).add_reviewer(args.name, admin=args.admin)
    print(f"reviewer '{args.name}' created. Token (shown once, store it safely):", file=sys.stderr)
    print(token)


def _remove_reviewer(store, args) -> None:
    released = _admin(store, args).remove_reviewer(args.name)
    print(f"reviewer '{args.name}' removed; their token and sessions no longer work; "
          f"{released} claim(s) released")


def _release(store, args) -> None:
    released = _admin(store, args).release(item_id=args.item, reviewer=args.reviewer)
    print(f"released {len(released)} claim(s): {', '.join(map(str, released)) or '-'}")


def _set_limits(store, args) -> None:
    given = {"default_lease_seconds": args.default_lease, "max_lease_seconds": args.max_lease,
             "max_claims_per_reviewer": args.max_claims}
    new = _admin(store, args).set_limits(**{k: v for k, v in given.items() if v is not None})
    print(", ".join(f"{k} {v}" for k, v in new.items()))


_ADMIN = {"init-db": _init_db, "add-reviewer": _add_reviewer,
          "remove-reviewer": _remove_reviewer, "release": _release, "set-limits": _set_limits}


# -- reviewer -----------------------------------------------------------------------------

def _reviewer(store: ReviewStore, args):
    return store.reviewer(_token(args, "token", "PROTDP_REVIEW_TOKEN", "reviewer"))


def _claim(store, args) -> None:
    item = _reviewer(store, args).claim(args.item, args.lease)
    if item is None:
        print("no pending items")
        return
    print(f"claimed item {item['id']} until {iso(item['lease_expires_at'])}")
    _show(store, item)


def _decide(store, args) -> None:
    item = _reviewer(store, args).decide(args.id, args.cmd, args.comment)
    print(f"item {item['id']} {item['state']} by {item['decided_by']}")


_REVIEWER = {"claim": _claim, "approve": _decide, "reject": _decide, "escalate": _decide}


# -- reading ------------------------------------------------------------------------------

def _list(store, args) -> None:
    if args.limit < 1:
        raise InputError(f"must be >= 1, got {args.limit}", field="--limit")
    found = store.list(args.state, reason=args.reason, target=args.target, limit=args.limit)
    for item in found:
        print(json.dumps(item, sort_keys=True) if args.json else _line(item))
    if not args.json:
        print(f"{len(found)} item(s)", file=sys.stderr)


def _show_cmd(store, args) -> None:
    item = store.get(args.id)
    if args.json:
        print(json.dumps({**item, "events": store.events(args.id)}, sort_keys=True))
    else:
        _show(store, item)


def _export(store, args) -> None:
    from protdp.data.safeio import atomic_write_text, writable_output

    if args.out is not None:     # before any work: a directory or an unwritable folder is one line
        writable_output(args.out, "export", "hdf5" if args.format == "store" else args.format,
                        force=args.force, replace_same_kind=False)
    if args.format == "store":
        from protdp.review.distill import export_distillation

        if args.out is None:
            raise InputError("--format store writes an HDF5 file: give --out FILE.h5",
                             field="--out")
        report = export_distillation(  # an admin's: it runs verify and re-hashes every file
            store, args.out, admin_token=_token(args, "admin_token", "PROTDP_REVIEW_ADMIN_TOKEN",
                                                "admin"),
            min_residue_plddt=args.min_residue_plddt)
        for s in report.skipped:
            print(f"skipped item {s['item_id']}: {s['reason']}", file=sys.stderr)
        print(f"wrote {len(report.exported)} approved prediction(s) as distillation families to "
              f"{args.out} ({len(report.skipped)} skipped)", file=sys.stderr)
        return
    data = store.export(args.format)
    if args.out is None:
        sys.stdout.write(data)
    else:
        atomic_write_text(args.out, data)  # a crash never leaves a half-written export
        print(f"wrote {args.format} export to {args.out}", file=sys.stderr)


def _stats(store, args) -> None:
    stats = store.stats()
    if args.json:
        print(json.dumps(stats, sort_keys=True))
        return
    print(f"total {stats['total']}: " + ", ".join(f"{k} {v}" for k, v in stats["by_state"].items()))
    for who, counts in sorted(stats["by_reviewer"].items()):
        print(f"  {_safe(who)}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if stats["oldest_pending_age_s"] is not None:
        print(f"oldest pending item waiting {stats['oldest_pending_age_s']:.0f} s")


def _verify(store, args) -> int:
    report = store.verify(args.expect_head)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        for problem in report["problems"]:
            print(f"PROBLEM {_safe(problem)}")
        if report["more_problems"]:
            print(f"... and {report['more_problems']} more")
        for problem in report["file_problems"]:
            print(f"FILE {_safe(problem['line'])}")
        if report["more_file_problems"]:
            print(f"... and {report['more_file_problems']} more changed files")
        print(f"{'ok' if report['ok'] else 'FAILED'}: {report['events']} audit events, "
              f"the files of {report['items_files_checked']} item"
              f"{'' if report['items_files_checked'] == 1 else 's'} re-hashed; head "
              f"{report['head']} (record it to detect a rewrite later: --expect-head)")
    return 0 if report["ok"] else 1


def _reviewers(store, args) -> None:
    for r in store.reviewers():
        flags = ("admin " if r["is_admin"] else "") + ("active" if r["active"] else "removed")
        print(f"{_safe(r['name']):<24} {flags:<14} since {iso(r['created_at'])}")


_READ = {"list": _list, "show": _show_cmd, "export": _export, "stats": _stats,
         "verify": _verify, "reviewers": _reviewers}
