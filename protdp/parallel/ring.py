"""Ring reduce-scatter / all-gather / all-reduce over torch.distributed point-to-point ops, on a
comm thread.

Why: gloo's own `reduce_scatter` is 1.1-5x slower than an `all_reduce` of the same buffer
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
isend/irecv and yields their Works; the worker runs the collectives one after another in the
order they were submitted (the same on every rank). Keeping several collectives posted at once
made no measurable difference on the simulated network (benchmarks/netsim.sh, 4 Gbit/s), so it
is not done. Every message still has a tag unique to (group, collective, step), so a message can
only ever match its own receive.
Receives time out with the process group's timeout (gloo), and the first failure poisons the
worker: later collectives fail at once instead of each waiting out the timeout.

The schedules are pure functions (`reduce_scatter_schedule`, `all_gather_schedule`) so the chunk
bookkeeping is unit-tested without a process group.
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Generator

import torch
import torch.distributed as dist

TAG_SPACE = 2**30  # gloo tags are 32-bit; (collective, step) pairs wrap around in this space

RingOp = Generator[list, None, object]  # yields the Works of one posted step; returns a result


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


class CommWorker:
    """A daemon thread that runs submitted ring ops one after another (FIFO).

    `submit(make_op, span, group)` takes `make_op(sequence) -> RingOp` and returns a Future;
    `span` (a 2-list) receives [start, done] perf_counter times, so callers can measure how long
    communication was really in flight. One worker per process (`shared_worker()`) serves every
    process group, so ops of different models on one group never share a tag.
    """

    def __init__(self, name: str = "protdp-comm"):
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

    def _loop(self):
        while (item := self._jobs.get()) is not None:
            make_op, fut, span, group = item
            if not fut.set_running_or_notify_cancel():
                continue
            if self._broken is not None:  # the ring is out of step: fail fast, don't wait again
                fut.set_exception(RuntimeError(f"an earlier collective on this rank failed "
                                               f"({self._broken})"))
                continue
            if span is not None:
                span[0] = time.perf_counter()
            sequence = self._sequences[group]
            self._sequences[group] += 1
            try:
                result, error = run_blocking(make_op(sequence)), None
            except BaseException as exc:  # delivered to the waiter; the ring is now broken
                result, error = None, exc
                self._broken = exc
            if span is not None:  # before the future completes: a waiter may read it at once
                span[1] = time.perf_counter()
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)


_SHARED: CommWorker | None = None
_SHARED_LOCK = threading.Lock()


def shared_worker() -> CommWorker:
    """The process's comm thread (created on first use)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or not _SHARED._thread.is_alive():
            _SHARED = CommWorker()
        return _SHARED
