"""`DataParallel`: Megatron-core style DDP with contiguous buffers and bucketed, overlapped reduction.

Megatron concepts (megatron/core/distributed/distributed_data_parallel.py, param_and_grad_buffer.py):
- all params of one dtype are views into one contiguous param buffer; their grads are views into
  one fp32 grad buffer (`param.main_grad`; fp32 params also get `param.grad` as that view, so
  autograd accumulates straight into the buffer, like torch DDP's gradient_as_bucket_view);
- post-accumulate-grad hooks count readiness per bucket (`protdp.parallel.bucket.Bucket`, which
  owns each bucket's run-time state; expected counts are learned on the first step, so a param
  whose grad is accumulated twice in one backward works); a complete bucket's collective is
  launched asynchronously (overlap_grad_reduce), in bucket order on every rank;
- grads are averaged once (divided by dp before a SUM collective, as torch DDP does);
- `finish_grad_sync()` waits for all buckets (its wait time is the *exposed* communication);
- `no_sync()` for all but the last micro-batch; `zero_grad_buffer()`; `broadcast_params()`;
- with the distributed optimizer, `start_param_sync()`/`finish_param_sync()` gather the updated
  param shards, optionally overlapped with the next forward through per-module pre-hooks;
- the collectives are chosen once (`protdp.parallel.strategy`): torch's for NCCL, point-to-point
  rings on a comm thread for gloo (`protdp.parallel.ring`, the CPU analogue of Megatron's
  communication stream).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from protdp.errors import ConfigError, DistributedError
from protdp.parallel import collectives as coll
from protdp.parallel.bucket import Bucket
from protdp.parallel.buffer import BufferLayout, build_layout, layout_hash, layout_summary
from protdp.parallel.config import ParallelConfig
from protdp.parallel.dap import reduce_dap_grads
from protdp.parallel.strategy import GroupContext, grad_reducer, param_gatherer


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class _Buffer:
    """Tensors backing one `BufferLayout`: params in their dtype, grads in fp32."""

    layout: BufferLayout
    param_data: torch.Tensor  # [numel] model dtype; params are views into it
    grad_data: torch.Tensor  # [numel] fp32; main_grads are views into it


class DataParallel(nn.Module):
    """Wrap `module` for data-parallel training over `process_group` (default: world)."""

    def __init__(self, module: nn.Module, config: ParallelConfig | None = None,
                 process_group=None, dap_params=None, dap_group=None):
        """`dap_params`/`dap_group` (dynamic axial parallelism): the parameters whose per-rank
        gradients are partial sums over the DAP group; each bucket's are summed over
        `dap_group` right before the bucket's DP collective is launched (in bucket order, the
        same on every rank), so the engine only ever reduces gradients that are consistent
        inside each DAP group, and still overlaps the backward pass."""
        super().__init__()
        self.dap_params = list(dap_params or [])
        self.dap_group = dap_group
        self.dap_rank = dist.get_rank(dap_group) if dap_group is not None else 0
        dap_ids = {id(p) for p in self.dap_params}
        self._dap_names = {n for n, p in module.named_parameters() if id(p) in dap_ids}
        if not dist.is_initialized():
            raise DistributedError("DataParallel needs a process group: call "
                                   "protdp.parallel.init_distributed() first")
        self.module = module
        self.config = config if config is not None else ParallelConfig()
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.dp = dist.get_world_size(process_group)
        self.src_rank = dist.get_global_rank(process_group, 0) if process_group else 0
        if self.config.data_parallel_size != self.dp:
            raise ConfigError(f"ParallelConfig.data_parallel_size={self.config.data_parallel_size} "
                              f"but the process group has {self.dp} ranks")
        named = self._trainable_params(module)
        self.params_by_name = dict(named)
        self._choose_collectives(named[0][1].device.type)
        self.layouts = build_layout([(n, tuple(p.shape), dtype_name(p.dtype)) for n, p in named],
                                    self.dp, self.config.resolved_bucket_size,
                                    self.config.param_align)
        self.layout_hash = layout_hash(self.layouts)
        self._check_layout_across_ranks()
        self.buffers = [self._build_buffer(lay) for lay in self.layouts]
        ctx = GroupContext(process_group, dist.get_process_group_ranks(process_group)
                           if process_group else list(range(self.dp)), self.rank, self.dp)
        reducer = grad_reducer(ctx, self.grad_collective)
        gatherer = param_gatherer(ctx, self.param_collective)
        # reduction order: every bucket of every buffer, as the collectives are issued
        self.buckets = [Bucket((g, b.index), b, buf.layout.dtype, self.rank, buf.grad_data,
                               buf.param_data, reducer, gatherer)
                        for g, buf in enumerate(self.buffers) for b in buf.layout.buckets]
        self._bucket_by_key = {b.key: b for b in self.buckets}
        self._bucket_of = {n: self._bucket_by_key[(g, lay.params[n].bucket)]
                           for g, lay in enumerate(self.layouts) for n in lay.params}
        self._name_of = {id(p): n for n, p in named}
        for _, p in named:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

        self.expected_grads: dict[str, int] | None = None   # learned on the first step
        self._sync_enabled = True
        self._finished = False
        self._warned_order = False
        self._grad_timeline = coll.CommTimeline()
        self._param_timeline = coll.CommTimeline()
        self._reset_sync_state()
        self._seen_in_window: set[str] = set()
        self.comm_stats = self._zero_stats()
        self.last_grad_sync = {"wait_s": 0.0, "comm_s": 0.0}
        if self.config.overlap_param_gather:
            self._register_param_gather_hooks()

    # ------------------------------------------------------------------ set-up
    @staticmethod
    def _trainable_params(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ConfigError("DataParallel: the module has no parameters that require grad")
        devices = sorted({str(p.device) for _, p in named})
        if len(devices) > 1:
            raise ConfigError(f"DataParallel: parameters are on several devices {devices}; move "
                              "the module to one device (e.g. module.to('cuda')) before wrapping")
        return named

    def _choose_collectives(self, device_type: str) -> None:
        """Collectives of the backend carrying this model's tensors ('cpu:gloo,cuda:nccl' ->
        nccl on CUDA), resolved from 'auto' once."""
        self.backend = coll.backend_for_device(dist.get_backend(self.group), device_type)
        distopt = self.config.use_distributed_optimizer
        self.grad_collective = coll.grad_reduce_collective(self.config.grad_reduce_collective,
                                                           self.backend, distopt)
        self.param_collective = (coll.param_gather_collective(
            self.config.param_gather_collective, self.backend) if distopt else None)
        rings = [c for c in (self.grad_collective, self.param_collective or "")
                 if c.startswith("ring")]
        if self.dp > 1 and rings and device_type != "cpu":
            raise ConfigError(
                f"DataParallel: {', '.join(rings)} (backend {self.backend}) moves CPU tensors, but "
                f"the parameters are on {device_type}; use the nccl backend for GPU tensors "
                "(init_distributed's default on CUDA machines) or choose torch's collectives: "
                "ParallelConfig(grad_reduce_collective='all_reduce', param_gather_collective="
                "'all_gather')")

    def _build_buffer(self, lay: BufferLayout) -> _Buffer:
        """Allocate one buffer pair and make its params / main_grads views into it."""
        first = self.params_by_name[next(iter(lay.params))]
        pbuf = torch.zeros(lay.numel, dtype=first.dtype, device=first.device)
        gbuf = torch.zeros(lay.numel, dtype=torch.float32, device=first.device)
        with torch.no_grad():
            for name, slot in lay.params.items():
                p = self.params_by_name[name]
                pbuf[slot.start:slot.end].copy_(p.detach().reshape(-1))
                p.data = pbuf[slot.start:slot.end].view(slot.shape)
                p.main_grad = gbuf[slot.start:slot.end].view(slot.shape)
                p.grad = p.main_grad if p.dtype == torch.float32 else None
        return _Buffer(lay, pbuf, gbuf)

    def _check_layout_across_ranks(self):
        """Hang prevention: all ranks must have the same buckets, else collectives mismatch."""
        if self.dp == 1:
            return
        mine = (self.layout_hash, layout_summary(self.layouts))
        gathered = [None] * self.dp
        coll.run("all_gather_object(layout hash)",
                 lambda: dist.all_gather_object(gathered, mine, group=self.group), self.rank)
        bad = [r for r, (h, _) in enumerate(gathered) if h != gathered[0][0]]
        if bad:
            lines = [f"  rank {r}: {h[:12]} ({s})" for r, (h, s) in enumerate(gathered)]
            raise DistributedError(
                f"rank {self.rank}: gradient-bucket layout differs across ranks "
                f"(ranks {bad} differ from rank 0); every rank must build the same model with the "
                "same ParallelConfig (bucket_size, param_align):\n" + "\n".join(lines))

    # ------------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate grads locally (no communication) — for all but the last micro-batch."""
        previous = self._sync_enabled
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = previous

    # ------------------------------------------------------------------ grad sync
    def _zero_stats(self) -> dict:
        return {"grad_sync_wait_s": 0.0, "grad_sync_comm_s": 0.0, "param_sync_wait_s": 0.0,
                "param_sync_comm_s": 0.0, "grad_syncs": 0}

    def _reset_sync_state(self):
        for bucket in self.buckets:
            bucket.reset()
        self._next = 0  # index into self.buckets of the next bucket to launch
        self._expected = 0  # index into self.buckets of the first bucket not yet complete
        self._grad_timeline.reset()

    def _on_grad_ready(self, p: torch.Tensor):
        name = self._name_of[id(p)]
        grad = p.grad
        if grad is not None and grad.data_ptr() != p.main_grad.data_ptr():
            p.main_grad.add_(grad)  # a fresh .grad (after zero_grad(set_to_none)) or a bf16 grad
            p.grad = p.main_grad if p.dtype == torch.float32 else None
        self._seen_in_window.add(name)
        self._finished = False
        if not self._sync_enabled:
            return
        bucket = self._bucket_of[name]
        bucket.register_grad_ready(name, self.expected_grads, self.rank)
        if bucket.is_complete(self.expected_grads):
            self._note_bucket_order(bucket)
            if self.config.overlap_grad_reduce:
                self._launch_ready_buckets()

    def _note_bucket_order(self, bucket: Bucket):
        """Advance past complete buckets; warn once when backward disagrees with bucket order."""
        first = self.buckets[self._expected] if self._expected < len(self.buckets) else None
        if bucket is not first and not self._warned_order:
            self._warned_order = True
            warnings.warn(
                f"DataParallel: bucket {bucket.key} was ready before bucket "
                f"{first.key if first else None}; the backward order disagrees with the bucket "
                "order (reverse registration order), so reductions wait; register modules in "
                "forward order for overlap", stacklevel=3)
        while (self._expected < len(self.buckets)
               and self.buckets[self._expected].is_complete(self.expected_grads)):
            self._expected += 1

    def _launch_ready_buckets(self, force: bool = False):
        # Launch strictly in bucket order so every rank issues the same collectives in order.
        while self._next < len(self.buckets) and (
                force or self.buckets[self._next].is_complete(self.expected_grads)):
            bucket = self.buckets[self._next]
            if self.dap_group is not None:   # DAP partial sums -> this DAP group's gradient
                mine = [self.params_by_name[n] for n in bucket.params if n in self._dap_names]
                coll.run("all_reduce(DAP gradients)",
                         lambda: reduce_dap_grads(mine, self.dap_group), self.rank)
            bucket.start_grad_sync(self.config.check_for_nan_in_grad, self._grad_timeline)
            self._next += 1

    def _learn_or_check_counts(self):
        """First step: the gradient counts just seen become the expected ones. Every step:
        params that got no gradient in the whole accumulation window are an error unless
        allow_unused_parameters."""
        counts = {n: self._bucket_of[n].counts[n] for n in self.params_by_name}
        missing = [n for n, c in counts.items() if c == 0 and n not in self._seen_in_window
                   and (self.expected_grads is None or self.expected_grads[n] > 0)]
        if missing and not self.config.allow_unused_parameters:
            self._reset_sync_state()
            raise ConfigError(
                f"rank {self.rank}: {len(missing)} parameter(s) received no gradient in this step: "
                f"{', '.join(missing[:10])}{' …' if len(missing) > 10 else ''}. Remove unused "
                "parameters, or set ParallelConfig(allow_unused_parameters=True) to treat their "
                "gradients as zero")
        if self.expected_grads is None:
            self.expected_grads = counts

    def finish_grad_sync(self):
        """Launch any bucket not yet launched, then wait for all reductions (idempotent per step).

        After it returns, every param's `.main_grad` holds the dp-averaged gradient (with a
        reduce-scatter only this rank's shard of each bucket is valid).
        """
        if self._finished:
            return
        if not self._sync_enabled:
            raise ConfigError("finish_grad_sync() called inside no_sync()")
        self._learn_or_check_counts()
        self._launch_ready_buckets(force=True)
        t0 = time.perf_counter()
        for bucket in self.buckets:
            bucket.finish_grad_sync()
        wait_s = time.perf_counter() - t0
        comm_s = self._grad_timeline.busy_s()
        self.last_grad_sync = {"wait_s": wait_s, "comm_s": comm_s}
        self.comm_stats["grad_sync_wait_s"] += wait_s
        self.comm_stats["grad_sync_comm_s"] += comm_s
        self.comm_stats["grad_syncs"] += 1
        self._reset_sync_state()
        self._seen_in_window = set()
        self._finished = True

    def local_nonfinite_flag(self) -> torch.Tensor:
        """0-dim fp64 on the grads' device: 1.0 if any checked bucket was non-finite, else 0.0
        (no host sync: the optimizer all-reduces it together with the grad norm)."""
        checks = [b.finite for b in self.buckets if b.finite is not None]
        if not checks:
            return torch.zeros((), dtype=torch.float64, device=self.buffers[0].grad_data.device)
        return torch.stack(checks).logical_not().any().double()

    def zero_grad_buffer(self):
        """Zero all grad buffers (and re-attach fp32 `.grad` views); start a new step."""
        for buf in self.buffers:
            buf.grad_data.zero_()
        for p in self.params_by_name.values():
            if p.dtype == torch.float32 and (p.grad is None
                                             or p.grad.data_ptr() != p.main_grad.data_ptr()):
                p.grad = p.main_grad
        self._reset_sync_state()
        for bucket in self.buckets:
            bucket.finite = None
        self._seen_in_window = set()
        self._finished = False

    # ------------------------------------------------------------------ params
    def broadcast_params(self):
        """Make every rank start from rank 0's params and module buffers."""
        self.finish_param_sync()
        if self.dp == 1:
            return
        with torch.no_grad():
            for buf in self.buffers:
                coll.run("broadcast(params)", lambda t=buf.param_data: dist.broadcast(
                    t, src=self.src_rank, group=self.group), self.rank)
            for name, t in self.module.named_buffers():
                coll.run(f"broadcast(buffer {name})", lambda t=t: dist.broadcast(
                    t, src=self.src_rank, group=self.group), self.rank)

    @property
    def bucket_keys(self) -> list[tuple[int, int]]:
        """(buffer, bucket) of every bucket in reduction order (the order of the collectives)."""
        return [b.key for b in self.buckets]

    def start_param_sync(self, keys=None):
        """Gather each rank's updated param shard of buckets `keys` (default: all, in forward
        order) into every rank's param buffer (async). Every rank must pass the same keys."""
        if self.dp == 1:
            return
        if not any(b.param_pending is not None for b in self.buckets):
            self._param_timeline.reset()
        # reverse bucket order: the last bucket holds the first layers, needed first by forward
        order = reversed(self.buckets) if keys is None else (self._bucket_by_key[k] for k in keys)
        for bucket in order:
            bucket.start_param_sync(self._param_timeline)

    def finish_param_sync(self, keys=None):
        """Wait for the param gathers of `keys` (default: all pending buckets)."""
        buckets = self.buckets if keys is None else [self._bucket_by_key[k] for k in keys]
        t0 = time.perf_counter()
        waited = [b.finish_param_sync() for b in buckets]
        if not any(waited):
            return
        self.comm_stats["param_sync_wait_s"] += time.perf_counter() - t0
        if not any(b.param_pending is not None for b in self.buckets):
            self.comm_stats["param_sync_comm_s"] += self._param_timeline.busy_s()

    def _register_param_gather_hooks(self):
        """Before a submodule's forward, wait only for the buckets holding its own params."""
        for mod in self.module.modules():
            keys = sorted({self._bucket_of[self._name_of[id(p)]].key
                           for p in mod.parameters(recurse=False) if id(p) in self._name_of})
            if keys:
                mod.register_forward_pre_hook(
                    lambda m, args, keys=tuple(keys): self.finish_param_sync(keys))
