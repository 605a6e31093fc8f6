"""What a run is doing, read from its work queue: done / running (which rank, host, process,
since when) / left / failed, for `protdp predict --status OUT`."""

from __future__ import annotations

import datetime as dt
import json

from sqlalchemy import inspect, select

from protdp.workqueue.engine import Engine, WorkQueueError
from protdp.workqueue.schema import FAILED, RUNNING, TODO, items, runs


def run_status(url: str, run_key: str | None = None, label: str | None = None) -> dict:
    """The state of run `run_key` (default: the run started last, among those labelled
    `label` when given) in the queue at `url`:
    {run_key, label, generation, now, counts, running: [...], failed: [...], runs}."""
    db = Engine(url)
    try:
        with db.tx(readonly=True) as conn:
            if not inspect(conn).has_table("work_runs"):
                raise WorkQueueError(f"{db.safe_url} holds no work queue (no run has started)")
            now = db.now(conn)
            all_runs = [r for r in conn.execute(select(runs).order_by(runs.c.started_at.desc()))
                        if label in (None, r.label)]
            run = next((r for r in all_runs if run_key in (None, r.run_key)), None)
            if run is None:
                which = " ".join(x for x in (run_key, None if label is None else f"of {label}")
                                 if x)
                raise WorkQueueError(f"{db.safe_url}: no run {which}".rstrip())
            rows = conn.execute(select(items).where(items.c.run_key == run.run_key)
                                .order_by(items.c.idx)).all()
    finally:
        db.close()
    counts = {s: sum(1 for r in rows if r.state == s) for s in (TODO, RUNNING, "done", FAILED)}
    running = [{"idx": r.idx, "name": r.name, "rank": r.rank, "host": r.host, "pid": r.pid,
                "since": r.claimed_at, "seconds": round(now - r.claimed_at, 1),
                "lease_left_s": round(r.lease_until - now, 1), "attempt": r.attempts,
                "expired": r.lease_until < now} for r in rows if r.state == RUNNING]
    failed = [{"idx": r.idx, "name": r.name,
               "detail": (json.loads(r.result) if r.result else {}).get("detail", "")}
              for r in rows if r.state == FAILED]
    return {"run_key": run.run_key, "label": run.label, "generation": run.generation,
            "started_at": run.started_at, "now": now, "total": len(rows), "counts": counts,
            "running": running, "failed": failed, "runs": len(all_runs)}


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds")


def format_status(st: dict) -> str:
    """The status as lines of text."""
    c = st["counts"]
    lines = [f"run {st['run_key'][:12]} ({st['label']}), generation {st['generation']}, "
             f"started {_when(st['started_at'])}",
             f"{c['done']} done, {c['running']} running, {c['todo']} left, {c['failed']} failed "
             f"of {st['total']}"]
    for r in st["running"]:
        state = "lease EXPIRED (process gone?), will be reclaimed" if r["expired"] else \
            f"lease {r['lease_left_s']:.0f} s left"
        lines.append(f"  running {r['name']}: rank {r['rank']} on {r['host']} pid {r['pid']} "
                     f"since {_when(r['since'])} ({r['seconds']:.0f} s, attempt {r['attempt']}; "
                     f"{state})")
    for r in st["failed"]:
        lines.append(f"  failed {r['name']}: {r['detail']}")
    if st["runs"] > 1:
        lines.append(f"({st['runs'] - 1} earlier run(s) with other inputs or settings in this "
                     "queue)")
    return "\n".join(lines)
