"""How gradient buckets are reduced and parameter shards gathered: chosen once per model.

Megatron concept: the bucket group issues its collective through the communication stream;
which collective is decided at start-up, not per call. `grad_reducer` / `param_gatherer` turn
the names chosen by `protdp.parallel.collectives` ("all_reduce", "reduce_scatter",
"ring_all_reduce", "ring_reduce_scatter"; "all_gather", "ring_all_gather") into objects with
one method, `launch`, so the buckets never test strings. The torch ones call torch.distributed's
async collectives; the ring ones queue point-to-point rings on the comm thread
(`protdp.parallel.ring`), which also runs the local non-finite check and the averaging there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from protdp.parallel import collectives as coll
from protdp.parallel import ring

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class GroupContext:
    """The data-parallel group a model's buckets talk over."""

    group: object                 # torch ProcessGroup (None = world)
    group_ranks: list[int]        # global ranks of the group, in group order
    rank: int                     # this rank within the group
    dp: int                       # group size


class GradReducer:
    """Averages one grad bucket over the group; `launch` returns a Pending (None if local)."""

    shards_only = False           # True: after the reduction only this rank's shard is valid

    def __init__(self, ctx: GroupContext, op: str):
        self.ctx, self.op = ctx, op

    def launch(self, data: torch.Tensor, shard: torch.Tensor, what: str,
               check: Callable[[], None], timeline: coll.CommTimeline) -> coll.Pending | None:
        raise NotImplementedError


class LocalReducer(GradReducer):
    """dp = 1: nothing to communicate; the local non-finite check still runs."""

    def launch(self, data, shard, what, check, timeline):
        check()
        return None


class TorchReducer(GradReducer):
    """torch.distributed all_reduce or reduce_scatter (NCCL's rings), SUM of grad / dp."""

    def __init__(self, ctx: GroupContext, op: str):
        super().__init__(ctx, op)
        self.shards_only = op == "reduce_scatter"

    def launch(self, data, shard, what, check, timeline):
        check()
        data.div_(self.ctx.dp)            # average once: SUM of grad/dp, as torch DDP does
        group = self.ctx.group
        if self.shards_only:
            fn = lambda: _reduce_scatter(shard, data, group=group, async_op=True)  # noqa: E731
        else:
            fn = lambda: dist.all_reduce(data, group=group, async_op=True)  # noqa: E731
        return coll.launch(what, fn, self.ctx.rank, timeline)


class RingReducer(GradReducer):
    """Point-to-point ring all-reduce / reduce-scatter on the comm thread (gloo)."""

    def __init__(self, ctx: GroupContext, op: str):
        super().__init__(ctx, op)
        self.shards_only = op == "ring_reduce_scatter"
        self.ring_op = ring.ring_reduce_scatter if self.shards_only else ring.ring_all_reduce
        self.worker = ring.shared_worker()

    def launch(self, data, shard, what, check, timeline):
        ctx = self.ctx
        make_op = lambda seq: self.ring_op(  # noqa: E731
            data, ctx.group, ctx.group_ranks, ctx.rank, seq, scale=1.0 / ctx.dp, before=check)
        return coll.launch_on(self.worker, what, make_op, ctx.rank, timeline, ctx.group)


class ParamGatherer:
    """All-gathers every rank's updated shard of one param bucket into the whole bucket."""

    def __init__(self, ctx: GroupContext, op: str):
        self.ctx, self.op = ctx, op
        self.worker = ring.shared_worker() if op == "ring_all_gather" else None

    def launch(self, data: torch.Tensor, shard: torch.Tensor, what: str,
               timeline: coll.CommTimeline) -> coll.Pending:
        ctx = self.ctx
        if self.worker is not None:
            make_op = lambda seq: ring.ring_all_gather(  # noqa: E731
                data, ctx.group, ctx.group_ranks, ctx.rank, seq)
            return coll.launch_on(self.worker, what, make_op, ctx.rank, timeline, ctx.group)
        fn = lambda: _all_gather(data, shard, group=ctx.group, async_op=True)  # noqa: E731
        return coll.launch(what, fn, ctx.rank, timeline)


def grad_reducer(ctx: GroupContext, op: str) -> GradReducer:
    """The reducer for collective `op` (already resolved from 'auto')."""
    if ctx.dp == 1:
        return LocalReducer(ctx, op)
    return RingReducer(ctx, op) if op.startswith("ring") else TorchReducer(ctx, op)


def param_gatherer(ctx: GroupContext, op: str | None) -> ParamGatherer | None:
    """The gatherer for `op`, or None without the distributed optimizer / at dp = 1."""
    return None if op is None or ctx.dp == 1 else ParamGatherer(ctx, op)
