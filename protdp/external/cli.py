"""`protdp gate DIR --from colabfold|alphafold2|alphafold3|boltz --out OUT`: every prediction
in a folder of another tool's outputs through protdp's confidence gate (interface scores
included); OUT/<target>/scores.json per target, OUT/gate_summary.tsv, flagged ones enqueued
for review (default queue OUT/review_queue.sqlite) bound to the exact bytes of their files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from protdp.external.discover import SOURCES
from protdp.external.gate import gate_folder
from protdp.gating.policy import load_gate_policy
from protdp.text import printable


def _parser() -> argparse.ArgumentParser:
    from protdp.workflows import add_gate_arguments

    p = argparse.ArgumentParser(prog="protdp gate", description=__doc__)
    p.add_argument("folder", help="the other tool's output folder")
    p.add_argument("--from", dest="source", required=True, choices=SOURCES,
                   help="the tool whose layout the folder has")
    p.add_argument("--out", required=True, help="output folder (OUT/<target>/scores.json)")
    add_gate_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from protdp.workflows import QueueSink, review_commands, review_queue_url

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    policy = load_gate_policy(args.gating)
    queue_url = review_queue_url(args.queue_url, args.out)
    sink = QueueSink(queue_url)
    try:
        rows = gate_folder(args.folder, args.source, args.out, policy, sink)
    finally:
        sink.close()
    for r in rows:
        said = " ".join(part for part in (r["route"], r["detail"]) if part)  # error: no route
        print(printable(f"  {r['status']}: {r['target']}: {said}".rstrip()),
              file=sys.stdout if r["status"] == "ok" else sys.stderr)
    ok = [r for r in rows if r["status"] == "ok"]
    flagged = sum(r["route"] == "needs_review" for r in ok)
    print(f"protdp gate: {len(rows)} targets: {len(ok) - flagged} accepted, {flagged} need "
          f"review, {len(rows) - len(ok)} unreadable; summary: "
          + printable(Path(args.out) / 'gate_summary.tsv'))
    if flagged:
        print("review the flagged predictions with:\n" + review_commands(queue_url))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
