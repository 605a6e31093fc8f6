"""A gradient bucket at run time (Megatron core's bucket group, `param_and_grad_buffer.py`).

The pure layout (`protdp.parallel.buffer`) says where a bucket's params live; a `Bucket` owns
what changes during a step: how many gradients each of its params has received, the pending
collective, the local "all finite" check, and the pending param gather of the distributed
optimizer. `DataParallel` only dispatches gradient-ready hooks to it.

Expected gradient counts (Megatron's golden per-param grad-ready counts): a parameter whose
gradient is accumulated more than once in one backward (e.g. shared weights under reentrant
activation checkpointing) fires its hook more than once. On the first step the counts are
learned (no bucket starts early); afterwards a bucket is complete when every param has received
its learned count, and one gradient more is an error naming the parameter.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import torch

from protdp.errors import DistributedError
from protdp.parallel import collectives as coll
from protdp.parallel.buffer import BucketLayout
from protdp.parallel.strategy import GradReducer, ParamGatherer


class Bucket:
    """One bucket of one buffer: its grad/param views, readiness and in-flight collectives."""

    def __init__(self, key: tuple[int, int], layout: BucketLayout, dtype: str, rank: int,
                 grad_data: torch.Tensor, param_data: torch.Tensor, reducer: GradReducer,
                 gatherer: ParamGatherer | None):
        self.key = key                                            # (buffer, bucket)
        self.params = tuple(layout.params)
        shard = layout.shards[rank]
        self.grad = grad_data[layout.start:layout.end]            # [bucket numel] fp32
        self.grad_shard = grad_data[shard.start:shard.end]        # this rank's shard
        self.param = param_data[layout.start:layout.end]          # [bucket numel] model dtype
        self.param_shard = param_data[shard.start:shard.end]
        self.reducer, self.gatherer = reducer, gatherer
        self.grad_what = f"{reducer.op}(grad bucket {layout.index} of {dtype} buffer)"
        self.param_what = f"{gatherer.op if gatherer else '-'}(param bucket {layout.index} of " \
                          f"{dtype} buffer)"
        self.counts: Counter = Counter()                          # grads received this step
        self.grad_pending: coll.Pending | None = None
        self.launched = False
        self.finite: torch.Tensor | None = None                   # 0-dim bool, on the device
        self.param_pending: coll.Pending | None = None

    # ------------------------------------------------------------------ gradients
    def register_grad_ready(self, name: str, expected: Mapping[str, int] | None, rank: int) -> None:
        """Count one gradient of `name`; too many (or any after launch) is an error."""
        if self.launched:
            raise DistributedError(
                f"rank {rank}: parameter '{name}' received a gradient after its bucket "
                f"{self.key} was already reduced (more gradients than on the first step)")
        self.counts[name] += 1
        if expected is not None and self.counts[name] > expected[name]:
            raise DistributedError(
                f"rank {rank}: parameter '{name}' received {self.counts[name]} gradients in one "
                f"backward, {expected[name]} on the first step; every step must run the same "
                "graph")

    def is_complete(self, expected: Mapping[str, int] | None) -> bool:
        """Every param has its expected count (None: counts not learned yet -> never early)."""
        return expected is not None and all(self.counts[n] >= expected[n] for n in self.params)

    def start_grad_sync(self, check_nan: bool, timeline: coll.CommTimeline) -> None:
        """Launch the bucket's reduction (the local non-finite check runs first)."""
        def check():
            if check_nan:
                self.finite = torch.isfinite(self.grad.sum())

        self.grad_pending = self.reducer.launch(self.grad, self.grad_shard, self.grad_what, check,
                                                timeline)
        self.launched = True

    def finish_grad_sync(self) -> None:
        if self.grad_pending is not None:
            self.grad_pending.wait()
            self.grad_pending = None

    def reset(self) -> None:
        """Forget this step's counts (a new window of gradients starts)."""
        self.counts.clear()
        self.grad_pending = None
        self.launched = False

    # ------------------------------------------------------------------ params (dist-opt)
    def start_param_sync(self, timeline: coll.CommTimeline) -> None:
        if self.gatherer is not None:
            self.param_pending = self.gatherer.launch(self.param, self.param_shard,
                                                      self.param_what, timeline)

    def finish_param_sync(self) -> bool:
        """Wait for a pending param gather; True if there was one."""
        if self.param_pending is None:
            return False
        pending, self.param_pending = self.param_pending, None
        pending.wait()
        return True
