"""Ring reduce-scatter / all-gather / all-reduce over torch.distributed point-to-point ops, on a
comm thread.

Why: gloo's own `reduce_scatter` is slower than an `all_reduce` of the same buffer
(benchmarks/results/ddp*.json "collectives"), although a ring reduce-scatter moves half the
bytes of a ring all-reduce. The distributed optimizer (Megatron dist-opt: reduce-scatter grads,
all-gather params) needs exactly that half. So on gloo the same textbook ring that NCCL runs
(Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms"; NCCL's ring) is issued as
`dist.isend`/`dist.irecv` between ring neighbours: n-1 steps, each sending one chunk of
size/n, so every rank sends (n-1)/n × size bytes per collective - half an all-reduce. A ring
all-reduce is the two in a row; on gloo it also costs less CPU than gloo's all_reduce, which
keeps a core busy while it waits.

Async: the steps of one collective depend on each other (receive, add, forward), so a
`CommWorker` thread drives them while the main thread computes - the CPU analogue of Megatron's
separate communication stream. Each collective is a generator that posts one ring step's
isend/irecv and yields their Works. The worker starts the collectives in the order they were
submitted (the same on every rank) and keeps up to `DEFAULT_WINDOW` (4) of them posted at once,
always waiting on the current step of the oldest one (`CommWorker` says why that order and not
the oldest posted step). Each ring step costs a rendezvous round trip (gloo matches a receive
with its send) besides the transfer; with later buckets already posted the transport keeps
moving bytes during it (benchmarks/ring_window.py measures window 1 against 4).
`PROTDP_COMM_WINDOW` overrides the window (1 = one collective at a time). Every message has a
tag unique to (group, collective, step), so messages of collectives in flight together never
match each other's receives.
Receives time out with the process group's timeout (gloo), and the first failure poisons the
worker: later collectives fail at once instead of each waiting out the timeout.

The schedules are pure functions (`reduce_scatter_schedule`, `all_gather_schedule`) so the chunk
bookkeeping is unit-tested without a process group.
"""

from __future__ import annotations

import atexit
import collections
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Generator

import torch
import torch.distributed as dist

from protdp.errors import ConfigError

TAG_SPACE = 2**30  # gloo tags are 32-bit; (collective, step) pairs wrap around in this space
DEFAULT_WINDOW = 4  # ring ops posted at once; PROTDP_COMM_WINDOW overrides it

RingOp = Generator[list, None, object]  # yields the Works of one posted step; returns a result


def window_from_env(environ) -> int:
    """Collectives the comm thread keeps posted: `PROTDP_COMM_WINDOW`, else DEFAULT_WINDOW."""
    text = environ.get("PROTDP_COMM_WINDOW", "").strip()
    if not text:
        return DEFAULT_WINDOW
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"PROTDP_COMM_WINDOW={text!r}: expected a positive integer (collectives "
                          "the comm thread keeps posted at once; 1 = one at a time)")
    return int(text)


def reduce_scatter_schedule(rank: int, world: int) -> list[tuple[int, int]]:
    """(chunk to send to rank+1, chunk to receive from rank-1 and add into) for each ring step.

    After all world-1 steps, chunk `rank` on `rank` holds the sum over all ranks.
    """
    return [((rank - s - 1) % world, (rank - s - 2) % world) for s in range(world - 1)]


def all_gather_schedule(rank: int, world: int) -> list[tuple[int, int]]:
    """(chunk to send to rank+1, chunk to receive from rank-1) for each ring step.

    Starts from each rank holding chunk `rank`; after world-1 steps every rank holds all chunks.
    """
    return [((rank - s) % world, (rank - s - 1) % world) for s in range(world - 1)]


def step_tag(sequence: int, step: int, world: int) -> int:
    """Message tag of ring step `step` (< 2 × world) of the `sequence`-th collective of a group."""
    return (sequence * 2 * world + step) % TAG_SPACE


def _post(send: torch.Tensor, recv: torch.Tensor, group, group_ranks: list[int], rank: int,
          tag: int) -> list:
    """Post: send `send` to the next rank of the ring, receive `recv` from the previous one."""
    world = len(group_ranks)
    nxt, prv = group_ranks[(rank + 1) % world], group_ranks[(rank - 1) % world]
    return [dist.irecv(recv, src=prv, group=group, tag=tag),
            dist.isend(send, dst=nxt, group=group, tag=tag)]


def ring_reduce_scatter(data: torch.Tensor, group, group_ranks: list[int], rank: int,
                        sequence: int = 0, scale: float = 1.0,
                        before: Callable[[], None] | None = None, first_step: int = 0) -> RingOp:
    """SUM-reduce-scatter `data` [world × chunk] in place; returns this rank's chunk × `scale`.

    Other chunks of `data` are left holding partial sums. `before()` runs first (on the worker).
    """
    if before is not None:
        before()
    world = len(group_ranks)
    chunks = data.view(world, -1)  # [world, chunk]
    tmp = torch.empty_like(chunks[0])  # [chunk]
    for step, (send_i, recv_i) in enumerate(reduce_scatter_schedule(rank, world)):
        yield _post(chunks[send_i], tmp, group, group_ranks, rank,
                    step_tag(sequence, first_step + step, world))
        chunks[recv_i].add_(tmp)
    mine = chunks[rank]
    if scale != 1.0:
        mine.mul_(scale)
    return mine


def ring_all_gather(data: torch.Tensor, group, group_ranks: list[int], rank: int,
                    sequence: int = 0, first_step: int = 0) -> RingOp:
    """All-gather in place: chunk `rank` of `data` [world × chunk] is this rank's contribution."""
    world = len(group_ranks)
    chunks = data.view(world, -1)  # [world, chunk]
    for step, (send_i, recv_i) in enumerate(all_gather_schedule(rank, world)):
        yield _post(chunks[send_i], chunks[recv_i], group, group_ranks, rank,
                    step_tag(sequence, first_step + step, world))
    return data


def ring_all_reduce(data: torch.Tensor, group, group_ranks: list[int], rank: int,
                    sequence: int = 0, scale: float = 1.0,
                    before: Callable[[], None] | None = None) -> RingOp:
    """SUM all-reduce in place (× `scale`): ring reduce-scatter, then ring all-gather."""
    yield from ring_reduce_scatter(data, group, group_ranks, rank, sequence, scale, before)
    yield from ring_all_gather(data, group, group_ranks, rank, sequence,
                               first_step=len(group_ranks) - 1)
    return data


def run_blocking(op: RingOp):
    """Drive a ring op to completion on the calling thread; returns its result."""
    try:
        while True:
            for work in next(op):
                work.wait()
    except StopIteration as stop:
        return stop.value


class _Job:
    """One submitted ring op on the worker: its generator, Future, span and posted Works."""

    __slots__ = ("op", "future", "span", "works")

    def __init__(self, op: RingOp, future: Future, span: list | None):
        self.op, self.future, self.span, self.works = op, future, span, []


class CommWorker:
    """A daemon thread that drives submitted ring ops, up to `window` of them posted at once.

    `submit(make_op, span, group)` takes `make_op(sequence) -> RingOp` and returns a Future;
    `span` (a 2-list) receives [start, done] perf_counter times, so callers can measure how long
    communication was really in flight. One worker per process (`shared_worker()`) serves every
    process group, so ops of different models on one group never share a tag.

    Ops start in submission order (the same on every rank); while fewer than `window` are in
    flight the next one is admitted and its first step posted at once. The worker always waits
    for the current step of the oldest op in flight and posts that op's next step as soon as it
    completes; newer ops' steps progress in the transport meanwhile. A ring step costs a
    rendezvous round trip (gloo matches every receive with its send) on top of the transfer;
    with the next buckets' messages already posted the link carries them during that round trip.

    Why the oldest op, not the oldest posted step: with 3+ ranks, waiting on a newer op's step
    can deadlock - rank A waits for op k+1, whose peer B has not admitted op k+1 because B's
    worker waits for A's next step of op k (found by the 3-rank test). Waiting by op order
    keeps a global order: the oldest unfinished op is admitted everywhere (all older ones are
    done, so no worker is blocked elsewhere) and every rank drives it to completion.
    """

    def __init__(self, name: str = "protdp-comm", window: int | None = None):
        self.window = window if window is not None else window_from_env(os.environ)
        if not isinstance(self.window, int) or self.window < 1:
            raise ConfigError(f"CommWorker window={self.window!r}: expected a positive integer")
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._broken: BaseException | None = None
        self._sequences: dict = collections.defaultdict(int)  # group -> ops started so far
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        # stop the thread before the interpreter finalizes: a daemon thread that is torn down
        # while it sits in a torch call aborts the process ("terminate called ...")
        atexit.register(self.close, join_s=5.0)

    def submit(self, make_op: Callable[[int], RingOp], span: list | None = None,
               group=None) -> Future:
        """Queue `make_op(sequence)`; `sequence` counts the ops of `group` (tags are per group,
        so every rank of the group numbers them alike)."""
        fut: Future = Future()
        self._jobs.put((make_op, fut, span, group))
        return fut

    def close(self, join_s: float = 0.0):
        """Stop the thread once queued ops are done (waits up to `join_s` seconds for it)."""
        self._jobs.put(None)
        if join_s > 0 and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(join_s)

    # ------------------------------------------------------------------ worker thread
    @staticmethod
    def _finish(job: _Job, result, error: BaseException | None):
        if job.span is not None:  # before the future completes: a waiter may read it at once
            job.span[1] = time.perf_counter()
        if error is None:
            job.future.set_result(result)
        else:
            job.future.set_exception(error)

    @staticmethod
    def _advance(job: _Job) -> bool:
        """Post the op's next step (True), or complete its future when it has none (False)."""
        try:
            job.works = next(job.op)
            return True
        except StopIteration as stop:
            CommWorker._finish(job, stop.value, None)
            return False

    def _start(self, item) -> _Job | None:
        """Admit a queued op and post its first step; None when it finished or was refused."""
        make_op, fut, span, group = item
        if not fut.set_running_or_notify_cancel():
            return None
        if self._broken is not None:  # the ring is out of step: fail fast, don't wait again
            fut.set_exception(RuntimeError(f"an earlier collective on this rank failed "
                                           f"({self._broken})"))
            return None
        if span is not None:
            span[0] = time.perf_counter()
        job = _Job(None, fut, span)
        sequence = self._sequences[group]
        self._sequences[group] += 1
        try:
            job.op = make_op(sequence)
            return job if self._advance(job) else None
        except BaseException as exc:
            self._finish(job, None, exc)
            raise

    def _loop(self):
        posted: collections.deque[_Job] = collections.deque()  # ops in flight, oldest first
        stopping = False
        while not stopping or posted:
            try:
                while not stopping and len(posted) < self.window:
                    try:  # block for new work only when nothing is in flight
                        item = self._jobs.get(block=not posted)
                    except queue.Empty:
                        break
                    if item is None:
                        stopping = True
                    elif (job := self._start(item)) is not None:
                        posted.append(job)
                if not posted:
                    continue
                # always the oldest op: a newer op's step may wait for a peer that has not
                # admitted that op yet, because its own worker waits here for the oldest one
                for work in posted[0].works:
                    work.wait()
                if not self._advance(posted[0]):
                    posted.popleft()
            except BaseException as exc:  # delivered to every waiter; the ring is now broken
                self._broken = exc  # (an op that failed in _start has its error already)
                for job in posted:
                    if not job.future.done():
                        self._finish(job, None, exc)
                posted.clear()


_SHARED: CommWorker | None = None
_SHARED_LOCK = threading.Lock()


def shared_worker() -> CommWorker:
    """The process's comm thread (created on first use)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or not _SHARED._thread.is_alive():
            _SHARED = CommWorker()
        return _SHARED


def comm_thread_id() -> int | None:
    """OS thread id of the process's comm thread (None before first use), for CPU accounting."""
    worker = _SHARED
    return worker._thread.native_id if worker is not None and worker._thread.is_alive() else None
