"""Holding a claimed item: a heartbeat thread renews its lease while the work runs, and the
drain loop takes items until the run has none left.

The lease is the only proof of life: a process killed with kill -9 (or a lost node) stops
renewing, its lease runs out after at most `lease_s`, and any other process of the run claims
the item again. A process that finds nothing to claim while other processes still hold leases
waits (until the first of those leases would run out, polling), so the last live process
finishes the run whatever died before it.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from protdp.workqueue.engine import WorkQueueError
from protdp.workqueue.queue import WorkItem, WorkQueue

RENEWALS_PER_LEASE = 4      # renew every lease_s / 4: three renewals may fail before it ends
WAIT_POLL_S = 2.0           # a waiting process looks again at least this often


class Heartbeat:
    """Renews this worker's lease on one item every `lease_s / RENEWALS_PER_LEASE` seconds in a
    daemon thread (`with Heartbeat(queue, idx): ...`). `lost` turns True when the lease is no
    longer ours (we stalled past it and another process took the item)."""

    def __init__(self, queue: WorkQueue, idx: int, every_s: float | None = None):
        self.queue, self.idx = queue, idx
        self.every_s = every_s or queue.lease_s / RENEWALS_PER_LEASE
        self.lost = False
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{idx}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                if not self.queue.renew(self.idx):
                    self.lost = True
                    return
                self.renewals += 1
            except Exception:            # noqa: BLE001 - the database is briefly unreachable
                continue                 # (or the connection dropped): the thread must live on

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _give_back(queue: WorkQueue, held: list) -> None:
    for item, hb in held:
        hb.__exit__(None, None, None)
        try:
            queue.release(item.idx)
        except WorkQueueError:       # the lease then runs out: the same outcome
            pass


def drain(queue: WorkQueue, work: Callable[[WorkItem], tuple[dict, bool]], *,
          on_done: Callable[[WorkItem, dict, bool], None] | None = None,
          on_claim: Callable[[WorkItem], None] | None = None, lookahead: int = 0,
          poll_s: float = WAIT_POLL_S) -> list[tuple[WorkItem, dict]]:
    """Claim and work items until every item of the run is final. `work(item)` returns
    (result row, failed); an exception gives the held items back (another process may take
    them) and propagates. With `lookahead` k, up to k more items are claimed (and leased)
    ahead of the one being worked, `on_claim(item)` told of each (to prepare its inputs).
    Returns the (item, result) pairs this process recorded; `on_done` is called after each
    (also for a result another process recorded first: `kept` False)."""
    mine, held = [], []          # held: [(item, heartbeat)], in claim order
    while True:
        while len(held) < 1 + lookahead:
            item = queue.claim()
            if item is None:
                break
            held.append((item, Heartbeat(queue, item.idx).__enter__()))
            if on_claim is not None:
                on_claim(item)
        if not held:
            counts = queue.counts()
            if counts["todo"] == 0 and counts["running"] == 0:
                return mine
            wait = counts["next_expiry_s"]
            time.sleep(poll_s if wait is None else min(poll_s, max(0.05, wait + 0.05)))
            continue
        item, hb = held.pop(0)
        try:
            result, failed = work(item)
        except BaseException:
            _give_back(queue, [(item, hb)] + held)
            raise
        hb.__exit__(None, None, None)
        kept = queue.complete(item.idx, result, failed=failed)
        if kept:
            mine.append((item, result))
        if on_done is not None:
            on_done(item, result, kept)
