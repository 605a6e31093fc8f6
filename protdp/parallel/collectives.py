"""Collectives with hang prevention, error naming and per-backend algorithm choice.

DESIGN.md "Distributed rules that prevent hangs": every collective is bounded by the process
group's timeout, and a failure (dead peer, timeout, mismatched op) becomes a `DistributedError`
that names this rank and the operation. Also records when each async collective was in flight,
so callers can report total communication time next to the exposed (waited-for) time.

Backend choice (measured with gloo, 2 and 3 ranks, on loopback and on the two-namespace network
of benchmarks/netsim.sh: benchmarks/results/ddp*.json "collectives"): gloo's own reduce_scatter
is slower than its all_reduce of the same buffer, while a ring reduce-scatter issued as
point-to-point messages (`protdp.parallel.ring`) moves half the bytes, and a ring all-reduce costs
less wall and CPU time than gloo's all_reduce, which burns CPU while it waits. So on gloo the
gradient buckets are reduced with those rings (reduce-scatter for the distributed optimizer,
all-reduce otherwise) and params all-gathered with the ring, all on the comm thread; with NCCL
torch's reduce_scatter / all_reduce / all_gather (rings already) are used, as in Megatron.
`protdp.parallel.strategy` turns the chosen names into the objects the buckets call.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import torch.distributed as dist

from protdp.errors import DistributedError


def backend_for_device(backend: str, device_type: str) -> str:
    """The backend that serves tensors of `device_type` in a process group of `backend`.

    `backend` is what `dist.get_backend()` returns: one name ('gloo', 'nccl') or a per-device
    list ('cpu:gloo,cuda:nccl', what `init_distributed` uses on CUDA machines so CPU tensors,
    e.g. metrics and object collectives, go to gloo and CUDA tensors to NCCL).
    """
    from torch.distributed.distributed_c10d import Backend, BackendConfig  # torch's own parser

    per_device = BackendConfig(Backend(backend)).get_device_backend_map()
    return per_device.get(device_type, next(iter(per_device.values())))


def grad_reduce_collective(requested: str, backend: str, distributed_optimizer: bool) -> str:
    """Collective for the gradient buckets, given the backend serving the buffers' device.

    With the distributed optimizer: 'reduce_scatter' (torch's), 'ring_reduce_scatter' (point-
    to-point ring on the comm thread) or 'all_reduce' (every rank then reads its own shard);
    without it: 'all_reduce' (torch's) or 'ring_all_reduce'.
    """
    if requested != "auto":
        return requested
    if backend == "nccl":
        return "reduce_scatter" if distributed_optimizer else "all_reduce"
    return "ring_reduce_scatter" if distributed_optimizer else "ring_all_reduce"


def param_gather_collective(requested: str, backend: str) -> str:
    """'all_gather' (torch's) or 'ring_all_gather' (point-to-point ring on the comm thread)."""
    if requested != "auto":
        return requested
    return "all_gather" if backend == "nccl" else "ring_all_gather"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def fail(rank: int, op: str, exc: BaseException, timeout_s: float | None = None) -> DistributedError:
    bound = f" (timeout {timeout_s:.0f} s)" if timeout_s else ""
    return DistributedError(
        f"rank {rank}: collective '{op}' failed{bound}: {_describe(exc)}. A peer rank has probably "
        "died, timed out or issued a different collective (every rank must run the same steps)")


def run(op: str, fn: Callable[[], object], rank: int):
    """Run a synchronous collective; errors become a DistributedError naming rank and op."""
    try:
        return fn()
    except DistributedError:
        raise
    except (RuntimeError, dist.DistError) as exc:
        raise fail(rank, op, exc) from exc


@dataclass
class CommTimeline:
    """Intervals [launch, done] of async collectives; `busy_s` is the length of their union."""

    intervals: list = field(default_factory=list)

    def reset(self):
        self.intervals = []

    def busy_s(self) -> float:
        spans = sorted((a, b) for a, b in self.intervals if a is not None and b is not None)
        total, cur_a, cur_b = 0.0, None, None
        for a, b in spans:
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    total += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        if cur_b is not None:
            total += cur_b - cur_a
        return total


class Pending:
    """An in-flight async collective (a torch Work, or a Future of the comm thread);
    `wait()` raises a DistributedError naming rank and op."""

    def __init__(self, op: str, work, rank: int, timeline: CommTimeline | None,
                 future: Future | None = None):
        self.op, self.work, self.rank, self.future = op, work, rank, future
        self.done_future = None
        self.span = None
        if timeline is not None and work is not None:
            span = [time.perf_counter(), None]
            timeline.intervals.append(span)

            def _mark(fut, span=span):
                span[1] = time.perf_counter()
                return None

            try:
                self.done_future = work.get_future().then(_mark)
            except RuntimeError:  # some Works (gloo reduce_scatter) have no future: end = wait
                self.span = span

    def wait(self):
        try:
            if self.future is not None:
                self.future.result()
                return
            self.work.wait()
            if self.done_future is not None:
                self.done_future.wait()
            if self.span is not None and self.span[1] is None:
                self.span[1] = time.perf_counter()
        except (RuntimeError, dist.DistError) as exc:
            raise fail(self.rank, self.op, exc) from exc


def launch(op: str, fn: Callable[[], object], rank: int,
           timeline: CommTimeline | None = None) -> Pending:
    """Start an async collective (`fn` must pass async_op=True and return the Work)."""
    try:
        work = fn()
    except (RuntimeError, dist.DistError) as exc:
        raise fail(rank, op, exc) from exc
    return Pending(op, work, rank, timeline)


def launch_on(worker, op: str, make_op: Callable, rank: int,
              timeline: CommTimeline | None = None, group=None) -> Pending:
    """Queue a ring op (`make_op(sequence)`) of `group` on a `ring.CommWorker` thread."""
    span = [None, None]
    if timeline is not None:
        timeline.intervals.append(span)
    return Pending(op, None, rank, None, future=worker.submit(make_op, span, group))
