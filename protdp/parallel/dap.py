"""Dynamic axial parallelism (DAP) collectives as autograd functions (FastFold, NVIDIA ScaleFold).

One sample's MSA and pair representations are split along one axis over the K ranks of a DAP
group. The forward collectives and their backwards:

| function              | forward                                | backward                         |
|-----------------------|----------------------------------------|----------------------------------|
| `scatter`             | keep my shard (replicated -> split)    | all-gather (every rank's input   |
|                       |                                        | feeds one shard each)            |
| `gather`              | all-gather an operand (split -> full)  | reduce-scatter (SUM, then split) |
| `gather_replicated`   | all-gather before replicated compute   | keep my shard (the gradient of   |
|                       | (structure module, heads)              | the full result is the same on   |
|                       |                                        | every rank)                      |
| `all_to_all`          | switch the split axis                  | the inverse all-to-all           |

`gather`'s backward must SUM: each rank uses the whole gathered operand (pair bias, triangle
operand, outer-product operand) for its own shard of the output, so the operand's gradient is the
sum of the K ranks' contributions. A split-only backward (FastFold's `_gather` backward as its code
reads) under-counts it; `AxialComm(split_only_gather_backward=True)` reproduces that for the
negative test only.

Parameters used inside the split blocks receive on each rank only its shard's contribution:
`reduce_dap_grads` sums them over the DAP group before the data-parallel engine averages over DP.

All collectives run on dim 0 of a contiguous tensor (`all_gather_into_tensor`,
`reduce_scatter_tensor`, `all_to_all_single`): NCCL's native path, and gloo implements the same
calls on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from protdp.parallel.dap_layout import padded_size


def _front(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.movedim(dim, 0).contiguous()


def _all_gather(x: torch.Tensor, dim: int, group, k: int) -> torch.Tensor:
    """[.., n, ..] on each rank -> [.., k·n, ..] (rank order) along `dim`."""
    xf = _front(x, dim)
    out = torch.empty((k * xf.shape[0],) + xf.shape[1:], dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, xf, group=group)
    return out.movedim(0, dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group, k: int) -> torch.Tensor:
    """[.., k·n, ..] on each rank -> the SUM over ranks of my shard [.., n, ..] along `dim`."""
    xf = _front(x, dim)
    out = torch.empty((xf.shape[0] // k,) + xf.shape[1:], dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, xf, group=group)
    return out.movedim(0, dim)


def _shard(x: torch.Tensor, dim: int, rank: int, k: int) -> torch.Tensor:
    n = x.shape[dim] // k
    return x.narrow(dim, rank * n, n).contiguous()


def _all_to_all(x: torch.Tensor, split_dim: int, cat_dim: int, group, k: int) -> torch.Tensor:
    """x split along `cat_dim` (full along `split_dim`) -> split along `split_dim`, full along
    `cat_dim`: piece j of `split_dim` goes to rank j; received pieces concatenate along cat_dim."""
    split_dim, cat_dim = split_dim % x.dim(), cat_dim % x.dim()
    pieces = torch.stack(x.chunk(k, dim=split_dim), dim=0).contiguous()   # [k, .. n/k along split ..]
    out = torch.empty_like(pieces)
    dist.all_to_all_single(out, pieces, group=group)                         # out[j] from rank j
    return torch.cat(out.unbind(0), dim=cat_dim)


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm):
        ctx.dim, ctx.comm = dim, comm
        return _shard(x, dim, comm.rank, comm.size)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.comm.group, ctx.comm.size), None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, comm):
        ctx.dim, ctx.comm = dim, comm
        return _all_gather(x, dim, comm.group, comm.size)

    @staticmethod
    def backward(ctx, grad):
        comm = ctx.comm
        if comm.split_only_gather_backward:   # the under-counting variant (negative test only)
            return _shard(grad, ctx.dim, comm.rank, comm.size), None, None
        return _reduce_scatter(grad, ctx.dim, comm.group, comm.size), None, None


class _GatherReplicated(_Gather):
    """The gather of `_Gather` whose consumer is replicated on every rank (its gradient is the
    same everywhere): the backward only keeps this rank's slice."""

    @staticmethod
    def backward(ctx, grad):
        return _shard(grad, ctx.dim, ctx.comm.rank, ctx.comm.size), None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, split_dim, cat_dim, comm):
        ctx.dims, ctx.comm = (split_dim, cat_dim), comm
        return _all_to_all(x, split_dim, cat_dim, comm.group, comm.size)

    @staticmethod
    def backward(ctx, grad):
        split_dim, cat_dim = ctx.dims
        return _all_to_all(grad, cat_dim, split_dim, ctx.comm.group, ctx.comm.size), None, None, None


@dataclass
class AxialComm:
    """One rank's view of its DAP group; the model's axial blocks call these methods (the model
    floor never imports torch.distributed itself). With `count_bytes`, `bytes_moved` adds up
    what each named collective moves per rank (benchmarks/dap.py checks it against
    `dap_layout.block_comm_bytes`)."""

    group: object
    size: int
    rank: int
    split_only_gather_backward: bool = False
    bytes_moved: dict = field(default_factory=dict)   # collective name -> bytes, when counting
    count_bytes: bool = False

    def _note(self, name: str, x: torch.Tensor, factor: float):
        if self.count_bytes:
            self.bytes_moved[name] = self.bytes_moved.get(name, 0) + int(
                x.numel() * x.element_size() * factor)

    def padded(self, n: int) -> int:
        return padded_size(n, self.size)

    def scatter(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Replicated -> my shard along `dim` (length must be a multiple of size)."""
        return _Scatter.apply(x, dim, self)

    def gather(self, x: torch.Tensor, dim: int, name: str = "all_gather") -> torch.Tensor:
        """My shard -> the full operand along `dim`; backward reduce-scatters (SUM)."""
        self._note(name, x, self.size - 1)
        return _Gather.apply(x, dim, self)

    def gather_replicated(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """My shard -> the full tensor for compute every rank repeats; backward keeps my shard."""
        return _GatherReplicated.apply(x, dim, self)

    def all_to_all(self, x: torch.Tensor, split_dim: int, cat_dim: int,
                   name: str = "all_to_all") -> torch.Tensor:
        """Split along `cat_dim` -> split along `split_dim`."""
        self._note(name, x, (self.size - 1) / self.size)
        return _AllToAll.apply(x, split_dim, cat_dim, self)

    def shard_of(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """My shard of a tensor every rank holds whole (masks: no gradient needed)."""
        return _shard(x, dim, self.rank, self.size)


def reduce_dap_grads(params, group) -> None:
    """SUM the gradients (`.main_grad` when the DP engine owns them, else `.grad`) of parameters
    used inside DAP-split blocks over the DAP group: afterwards they are identical on every rank
    of the group and equal one process's gradient of the same sample(s). One coalesced
    all-reduce; call once per optimizer step for each parameter, after its last gradient
    accumulation and before its DP reduction (`DataParallel` does it per bucket)."""
    grads = []
    for p in params:
        g = getattr(p, "main_grad", None)
        g = p.grad if g is None else g
        if g is not None:
            grads.append(g)
    if not grads:
        return
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n
