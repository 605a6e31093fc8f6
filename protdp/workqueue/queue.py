"""A leased work queue shared by every process of a run.

Each process (a torchrun / mpirun / SLURM rank, or a `protdp predict` started by hand on the
same output folder) `join`s the run, then `claim`s the next item, costliest first, and holds it
under a lease (database clock) that it `renew`s while it works (`lease.Heartbeat`). It then
marks the item `complete` with its result row (done, or failed: a final state too). An item
whose lease ran out (its process was killed, its node lost) is claimable again, so whatever
dies when, every item ends with exactly one result. The same claim is a single write
transaction (SQLite: BEGIN IMMEDIATE; PostgreSQL: FOR UPDATE SKIP LOCKED), so two processes
never hold one item.

A holder on this machine whose process is gone (its pid no longer exists: a kill -9, a crash)
is not waited for: its items are claimable at once. "This machine" is the holder's `node`
(`node_id`: hostname, boot id and pid namespace), never the hostname alone: containers on
several nodes often share one hostname, and a pid means nothing in another pid namespace. A
holder on another node, or one whose node is unknown, is reclaimed only when its lease runs
out.

A run is named by a `run_key` (what it computes); joining a run that is still going (items left,
or leased) takes only what is not done; joining one that finished starts its next generation,
every item to do again (the predictor then verifies and skips completed work).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass

from sqlalchemy import and_, func, inspect, or_, select, text

from protdp.workqueue.engine import Engine, WorkQueueError
from protdp.workqueue.schema import (DONE, FAILED, FINAL_STATES, RUNNING, TODO, items,
                                     metadata, runs)

DEFAULT_LEASE_S = 120.0
_PG_SCHEMA_LOCK = 7310571


def pid_alive(pid: int | None) -> bool:
    """Whether process `pid` exists on this host (a zombie counts as gone only once reaped)."""
    if not pid or pid < 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:        # exists, another user's
        return True
    return True


@dataclass(frozen=True)
class WorkItem:
    """One unit of work: its index in the input, a name, and its relative cost."""
    idx: int
    name: str
    cost: float


def node_id() -> str | None:
    """The machine and pid namespace this process's pids live in: hostname, boot id and
    pid-namespace inode (Linux /proc); None where they cannot be read (then no lease of this
    process is ever ended by a pid check, only by running out)."""
    try:
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{socket.gethostname()}/{boot}/{pid_ns}"


@dataclass(frozen=True)
class Worker:
    """Who holds a lease: the rank of its launch, its host and process id, and the node its
    pid is valid on (`node_id`; None: unknown, its pid is never checked)."""
    rank: int = 0
    host: str = ""
    pid: int = 0
    node: str | None = None

    @classmethod
    def this_process(cls, rank: int = 0) -> "Worker":
        return cls(rank, socket.gethostname(), os.getpid(), node_id())

    @property
    def owner(self) -> str:
        """The lease holder's identity: host:pid, and the node when known (two containers
        with one hostname may run the same pid)."""
        return f"{self.host}:{self.pid}" + ("" if self.node is None else f"@{self.node}")


class WorkQueue:
    """The items of run `run_key` in the queue database at `url`."""

    def __init__(self, url: str, run_key: str, *, lease_s: float = DEFAULT_LEASE_S,
                 worker: Worker | None = None, largest_first: bool = True,
                 engine: Engine | None = None):
        if not lease_s > 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s!r}")
        self.db = engine or Engine(url)
        self.run_key = run_key
        self.lease_s = float(lease_s)
        self.worker = worker or Worker.this_process()
        self.largest_first = largest_first
        self.generation: int | None = None
        self.results_generation: int | None = None
        self._ensure_schema()

    # -- run ------------------------------------------------------------------------------
    def _ensure_schema(self) -> None:
        with self.db.tx() as conn:
            if self.db.dialect == "postgresql":       # concurrent first use on many nodes
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_SCHEMA_LOCK})
            metadata.create_all(conn)
            columns = {c["name"] for c in inspect(conn).get_columns(items.name)}
            if "node" not in columns:     # a queue made before the column: its rows unknown
                conn.execute(text(f"ALTER TABLE {items.name} ADD COLUMN node TEXT"))

    def _lock_run(self, conn) -> None:
        if self.db.dialect == "postgresql":           # SQLite: BEGIN IMMEDIATE holds it
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"),
                         {"k": int(self.run_key[:15], 16)})

    def join(self, work: list[WorkItem], label: str = "") -> int:
        """Enter the run holding `work` (created on first use); a run whose every item is
        final starts its next generation with every item to do. Returns the generation."""
        with self.db.tx() as conn:
            self._lock_run(conn)
            now = self.db.now(conn)
            row = conn.execute(select(runs.c.generation, runs.c.total)
                               .where(runs.c.run_key == self.run_key)).first()
            if row is None:
                conn.execute(runs.insert().values(run_key=self.run_key, generation=1,
                                                  total=len(work), label=label, started_at=now))
                if work:
                    conn.execute(items.insert(), [
                        {"run_key": self.run_key, "idx": w.idx, "name": w.name,
                         "cost": float(w.cost), "state": TODO, "attempts": 0} for w in work])
                self.generation = 1
                return 1
            if row.total != len(work):
                raise WorkQueueError(f"work queue {self.db.safe_url}: run {self.run_key[:12]} "
                                     f"has {row.total} items, this process {len(work)}")
            open_items = conn.execute(select(func.count()).where(
                items.c.run_key == self.run_key,
                items.c.state.not_in(FINAL_STATES))).scalar()
            generation = row.generation
            if open_items == 0:                        # finished: go again, verify everything
                generation += 1
                conn.execute(runs.update().where(runs.c.run_key == self.run_key)
                             .values(generation=generation, started_at=now))
                conn.execute(items.update().where(items.c.run_key == self.run_key).values(
                    state=TODO, owner=None, rank=None, host=None, pid=None, node=None,
                    claimed_at=None, lease_until=None, attempts=0, finished_at=None,
                    result=None))
            self.generation = generation
            return generation

    # -- items ------------------------------------------------------------------------------
    def _expire_dead_holders(self, conn, now: float) -> None:
        """Leases held by processes of this node (`node_id`, not merely this hostname) that no
        longer exist end now; a holder elsewhere, or of unknown node, keeps its lease."""
        if self.worker.node is None:
            return
        held = conn.execute(select(items.c.idx, items.c.pid).where(
            items.c.run_key == self.run_key, items.c.state == RUNNING,
            items.c.node == self.worker.node, items.c.lease_until >= now)).all()
        dead = [r.idx for r in held if r.pid != self.worker.pid and not pid_alive(r.pid)]
        if dead:
            conn.execute(items.update().where(items.c.run_key == self.run_key,
                                              items.c.idx.in_(dead))
                         .values(lease_until=now - 1.0))

    def claim(self) -> WorkItem | None:
        """The next free item (to do, or leased by a process whose lease ran out or that is
        gone from this host), costliest first, leased to this worker; None when there is
        none right now."""
        order = (items.c.cost.desc() if self.largest_first else items.c.cost.asc(),
                 items.c.idx.asc())
        with self.db.tx() as conn:
            now = self.db.now(conn)
            self._expire_dead_holders(conn, now)
            free = or_(items.c.state == TODO,
                       and_(items.c.state == RUNNING, items.c.lease_until < now))
            row = conn.execute(select(items.c.idx, items.c.name, items.c.cost)
                               .where(items.c.run_key == self.run_key, free)
                               .order_by(*order).limit(1)
                               .with_for_update(skip_locked=True)).first()
            if row is None:
                return None
            w = self.worker
            conn.execute(items.update().where(items.c.run_key == self.run_key,
                                              items.c.idx == row.idx).values(
                state=RUNNING, owner=w.owner, rank=w.rank, host=w.host, pid=w.pid, node=w.node,
                claimed_at=now, lease_until=now + self.lease_s, attempts=items.c.attempts + 1))
            return WorkItem(row.idx, row.name, row.cost)

    def _mine(self, idx: int):
        return and_(items.c.run_key == self.run_key, items.c.idx == idx,
                    items.c.state == RUNNING, items.c.owner == self.worker.owner)

    def renew(self, idx: int) -> bool:
        """Extend this worker's lease on `idx`; False when it is no longer ours."""
        with self.db.tx() as conn:
            now = self.db.now(conn)
            n = conn.execute(items.update().where(self._mine(idx))
                             .values(lease_until=now + self.lease_s)).rowcount
        return n == 1

    def complete(self, idx: int, result: dict, *, failed: bool = False) -> bool:
        """Record the result of `idx` (done, or failed); False when the item is no longer
        ours (our lease ran out and another process took it: its result counts)."""
        body = json.dumps(result, sort_keys=True)
        with self.db.tx() as conn:
            now = self.db.now(conn)
            n = conn.execute(items.update().where(self._mine(idx)).values(
                state=FAILED if failed else DONE, result=body, finished_at=now,
                lease_until=None)).rowcount
        return n == 1

    def release(self, idx: int) -> None:
        """Give `idx` back (this process stops without a result: an error to re-raise)."""
        with self.db.tx() as conn:
            conn.execute(items.update().where(self._mine(idx)).values(
                state=TODO, owner=None, rank=None, host=None, pid=None, node=None,
                claimed_at=None, lease_until=None))

    # -- the whole run ----------------------------------------------------------------------
    def counts(self) -> dict:
        """{todo, running, done, failed, total, expired (leases run out), next_expiry_s
        (seconds until the first live lease runs out, None without one)}."""
        with self.db.tx(readonly=True) as conn:
            now = self.db.now(conn)
            by_state = dict(conn.execute(select(items.c.state, func.count())
                                         .where(items.c.run_key == self.run_key)
                                         .group_by(items.c.state)).all())
            expired = conn.execute(select(func.count()).where(
                items.c.run_key == self.run_key, items.c.state == RUNNING,
                items.c.lease_until < now)).scalar()
            first = conn.execute(select(func.min(items.c.lease_until)).where(
                items.c.run_key == self.run_key, items.c.state == RUNNING,
                items.c.lease_until >= now)).scalar()
        out = {s: int(by_state.get(s, 0)) for s in (TODO, RUNNING, DONE, FAILED)}
        out.update(total=sum(out.values()), expired=int(expired),
                   next_expiry_s=None if first is None else max(0.0, first - now))
        return out

    def finished(self) -> bool:
        c = self.counts()
        return c["todo"] == c["running"] == 0

    def results(self) -> list[dict] | None:
        """Every item's result row in input order, or None while any item is not final (read
        in one transaction, so a run restarted meanwhile is never half-read). The generation
        they belong to, read in the same transaction, is `results_generation` (a process that
        joined earlier may hold an older `generation`)."""
        with self.db.tx(readonly=True) as conn:
            rows = conn.execute(select(items.c.idx, items.c.state, items.c.result)
                                .where(items.c.run_key == self.run_key)
                                .order_by(items.c.idx)).all()
            self.results_generation = conn.execute(
                select(runs.c.generation).where(runs.c.run_key == self.run_key)).scalar()
        if any(r.state not in FINAL_STATES for r in rows):
            return None
        return [json.loads(r.result) for r in rows]

    def close(self) -> None:
        self.db.close()
