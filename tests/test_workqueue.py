"""The leased work queue (`protdp.workqueue`) on SQLite and on a real PostgreSQL server: claims
costliest first, never one item to two processes (several processes draining one run), a
process killed with kill -9 loses its item only until its lease runs out, a lost lease keeps
the other process's result, and a run joined again takes only what is not done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from protdp.paths import REPO_ROOT
from protdp.workqueue import (Heartbeat, WorkItem, WorkQueue, Worker, drain, format_status,
                              run_status)
from review_fixtures import queue_url  # noqa: F401  (fixture: SQLite file and PostgreSQL)

KEY = "ab" * 32
COSTS = [4.0, 9.0, 1.0, 9.0, 16.0, 2.0]


def _items(costs=COSTS):
    return [WorkItem(i, f"t{i}", c) for i, c in enumerate(costs)]


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}


def test_claims_costliest_first_and_rejoin(queue_url):  # noqa: F811
    q = WorkQueue(queue_url, KEY, lease_s=30)
    assert q.join(_items(), label="run") == 1
    order = []
    drained = drain(q, lambda it: (order.append(it.idx) or {"name": it.name}, it.idx == 2))
    assert order == [4, 1, 3, 0, 5, 2]                 # cost descending, ties by input order
    assert [it.idx for it, _ in drained] == order
    assert q.results() == [{"name": f"t{i}"} for i in range(6)]
    c = q.counts()
    assert (c["done"], c["failed"], c["todo"], c["running"]) == (5, 1, 0, 0)
    # a finished run joined again: its next generation, every item to do (verified afresh)
    assert q.join(_items(), label="run") == 2 and q.counts()["todo"] == 6
    assert q.results() is None
    # an unfinished run joined again (a re-launch after a crash): only what is not done
    first = q.claim()
    assert q.complete(first.idx, {"name": first.name})
    other = WorkQueue(queue_url, KEY, lease_s=30, worker=Worker(1, "elsewhere", 42))
    assert other.join(_items(), label="run") == 2
    assert other.counts()["done"] == 1 and other.claim().idx != first.idx
    # shortest first (--sort-queries-by-length)
    short = WorkQueue(queue_url, "cd" * 32, lease_s=30, largest_first=False)
    short.join(_items())
    assert [short.claim().idx for _ in range(3)] == [2, 5, 0]
    for w in (q, other, short):
        w.close()


def test_lost_lease_keeps_the_other_result(queue_url):  # noqa: F811
    slow = WorkQueue(queue_url, KEY, lease_s=0.3, worker=Worker(0, "a", 1))
    slow.join(_items([5.0]))
    item = slow.claim()
    time.sleep(0.4)                                      # stalled past its lease
    fast = WorkQueue(queue_url, KEY, lease_s=30, worker=Worker(1, "b", 2))
    assert fast.claim() == item and fast.complete(item.idx, {"by": "fast"})
    assert not slow.renew(item.idx)
    assert not slow.complete(item.idx, {"by": "slow"})   # too late: not recorded
    assert slow.results() == [{"by": "fast"}]
    slow.close()
    fast.close()


DRAIN_WORKER = """
import sys, time
from protdp.workqueue import WorkQueue, Worker, WorkItem, drain
url, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = WorkQueue(url, key, lease_s=30, worker=Worker.this_process(int(sys.argv[4])))
q.join([WorkItem(i, f"t{i}", i % 7) for i in range(n)])
drain(q, lambda it: (time.sleep(0.01) or {"idx": it.idx, "rank": q.worker.rank}, False))
"""


def test_processes_never_share_an_item(queue_url):  # noqa: F811
    n = 60
    procs = [subprocess.Popen([sys.executable, "-c", DRAIN_WORKER, queue_url, KEY, str(n),
                               str(r)], env=_env()) for r in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    q = WorkQueue(queue_url, KEY)
    results = q.results()
    assert [r["idx"] for r in results] == list(range(n))
    st = run_status(queue_url)
    assert st["counts"]["done"] == n and st["running"] == []
    from sqlalchemy import select

    from protdp.workqueue.schema import items
    with q.db.tx(readonly=True) as conn:
        attempts = conn.execute(select(items.c.attempts).where(items.c.run_key == KEY)).scalars()
        assert set(attempts) == {1}                      # nobody claimed an item twice
    q.close()


HOLD_WORKER = """
import os, socket, sys, time
from protdp.workqueue import Heartbeat, WorkQueue, Worker, WorkItem
url, key, lease, host = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
q = WorkQueue(url, key, lease_s=lease, worker=Worker(1, host, os.getpid()) if host else
              Worker.this_process(1))
q.join([WorkItem(i, f"t{i}", c) for i, c in enumerate(%r)])
item = q.claim()
with Heartbeat(q, item.idx):
    print(item.idx, flush=True)
    time.sleep(600)
""" % (COSTS,)


def _hold(queue_url, lease, host=""):
    """A process (rank 1, on `host`: another node) that claims the costliest item and renews
    its lease until it is killed; returns it and the item it holds."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_WORKER, queue_url, KEY, str(lease), host],
                            env=_env(), stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def _drain_after_kill(q, proc):
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = time.monotonic()
    reclaimed = {}

    def work(it):
        reclaimed.setdefault(it.idx, time.monotonic() - killed_at)
        return {"idx": it.idx}, False

    drain(q, work, poll_s=0.1)
    assert [r["idx"] for r in q.results()] == list(range(6))    # each item once
    assert set(reclaimed) == set(range(6))
    return reclaimed


def test_killed_process_item_reclaimed_after_its_lease(queue_url):  # noqa: F811
    lease = 1.5
    proc, held = _hold(queue_url, lease, host="node-b")             # on another node
    q = WorkQueue(queue_url, KEY, lease_s=lease, worker=Worker(0, "node-a", os.getpid()))
    try:
        assert held == 4                                     # the costliest
        q.join(_items())
        time.sleep(lease * 1.5)                              # the heartbeat keeps it alive
        st = run_status(queue_url)
        assert [(r["idx"], r["rank"], r["pid"], r["expired"]) for r in st["running"]] == [
            (4, 1, proc.pid, False)]
        assert f"running t4: rank 1 on node-b pid {proc.pid}" in format_status(st)
    finally:
        reclaimed = _drain_after_kill(q, proc)
    # the killed process's item came back once its lease ran out, not before, and soon after
    assert lease * 0.5 <= reclaimed[4] <= lease + 5.0
    q.close()


def test_killed_process_on_this_host_not_waited_for(queue_url):  # noqa: F811
    lease = 60.0
    proc, held = _hold(queue_url, lease)                      # this host: its pid tells
    q = WorkQueue(queue_url, KEY, lease_s=lease)
    q.join(_items())
    reclaimed = _drain_after_kill(q, proc)
    assert held == 4 and reclaimed[4] < lease / 4
    q.close()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_a_holder_on_this_node_is_judged_by_its_pid(queue_url):  # noqa: F811
    """A dead pid frees its item at once only when it is a pid of this node (hostname, boot
    id, pid namespace): a holder on another node with the same hostname (containers) or of
    unknown node (a queue from before the node column) keeps its lease until it runs out."""
    from protdp.workqueue.queue import node_id
    here = Worker.this_process(0)
    assert here.node == node_id() is not None and here.node.startswith(here.host)
    dead = _dead_pid()
    holders = {0: Worker(1, here.host, dead, node=here.node),          # this node: freed
               4: Worker(1, here.host, dead, node="other-container"),  # same hostname
               1: Worker(1, here.host, dead)}                          # node unknown
    for idx, worker in holders.items():
        other = WorkQueue(queue_url, KEY, lease_s=60, worker=worker)
        other.join(_items())
        taken = []                          # the holder claims down to its item
        while not taken or taken[-1] != idx:
            taken.append(other.claim().idx)
        for i in taken[:-1]:
            other.release(i)
        other.close()
    q = WorkQueue(queue_url, KEY, lease_s=60, worker=here)
    claimed = set()
    while (item := q.claim()) is not None:
        claimed.add(item.idx)
    assert claimed == {0, 2, 3, 5}          # 4 and 1 wait for their leases
    st = run_status(queue_url)
    assert sorted((r["idx"], r["pid"]) for r in st["running"] if r["pid"] == dead) == [
        (1, dead), (4, dead)]
    q.close()


def test_queue_from_before_the_node_column_is_upgraded(tmp_path):
    import sqlite3
    url = str(tmp_path / "q.sqlite")
    WorkQueue(url, KEY, worker=Worker.this_process()).close()
    with sqlite3.connect(url) as conn:                # the table as the first release made it
        conn.execute("ALTER TABLE work_items DROP COLUMN node")
    q = WorkQueue(url, KEY, lease_s=60, worker=Worker.this_process())
    q.join(_items())
    assert q.claim().idx == 4 and run_status(url)["running"][0]["pid"] == os.getpid()
    q.close()


def test_heartbeat_renews_until_stopped(tmp_path):
    q = WorkQueue(str(tmp_path / "q.sqlite"), KEY, lease_s=0.4)
    q.join(_items([1.0]))
    item = q.claim()
    with Heartbeat(q, item.idx) as hb:
        time.sleep(1.2)                                   # three leases long
        assert q.counts()["expired"] == 0
    assert hb.renewals >= 3 and not hb.lost
    time.sleep(0.5)
    assert q.counts()["expired"] == 1                     # no heartbeat: the lease runs out
    q.close()


def test_bad_urls_are_one_line(tmp_path):
    from protdp.errors import InputError
    with pytest.raises(InputError, match="in-memory"):
        WorkQueue("sqlite://", KEY)
    with pytest.raises(InputError, match="unsupported work-queue database 'mysql'"):
        WorkQueue("mysql://x@y/z", KEY)
    with pytest.raises(InputError, match="does not exist"):
        WorkQueue(str(tmp_path / "nope" / "q.sqlite"), KEY)


def test_one_progress_bar_for_the_whole_run(tmp_path, capsys):
    """The bar counts every process's finished items (here another worker's), not this one's."""
    from protdp.workqueue.progress import RunProgress
    url = str(tmp_path / "q.sqlite")
    q = WorkQueue(url, KEY, lease_s=30)
    q.join(_items())
    other = WorkQueue(url, KEY, lease_s=30, worker=Worker(1, "elsewhere", 7))
    for _ in range(2):
        assert other.complete(other.claim().idx, {})
    with RunProgress(q, "predict", poll_s=0.05):
        time.sleep(0.3)
        assert "2/6" in capsys.readouterr().err
        drain(other, lambda it: ({}, False))
        time.sleep(0.3)
    assert "6/6" in capsys.readouterr().err
    with RunProgress(q, "predict", enabled=False):
        pass
    assert capsys.readouterr().err == ""
    q.close()
    other.close()
