"""Global gradient norm, the non-finite vote and the clipping coefficient (Megatron concept:
`megatron/core/optimizer/clip_grads.py`), as functions the optimizer calls.

The norm is the sum of squares over each rank's shard of every bucket (after the reduction every
shard holds the averaged gradient), blocked fp32 norms summed in fp64, plus one all_reduce; it
equals `torch.nn.utils.clip_grad_norm_` and stays within ~1e-8 of an fp64 norm at any bucket
size. Each rank's local non-finite check (done before its bucket collectives, kept on the
device) travels in the same all_reduce, so every rank takes the same skip decision. The tensor
lives on the grads' device: with NCCL one device all_reduce and one host read per step.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from protdp.parallel import collectives as coll

NORM_BLOCK = 256


def sum_of_squares_fp64(flat: torch.Tensor, block: int = NORM_BLOCK) -> torch.Tensor:
    """Sum of squares of a flat fp32 tensor as a 0-dim fp64 tensor (on its device).

    fp32 norms of blocks of `block` elements, their squares summed in fp64: one fp32
    `vector_norm` over a whole bucket accumulates sequentially on CPU and its error grows with
    the bucket size, while an fp64 sum of squares is exact but many times slower on CPU. The
    errors and times of the three are measured by benchmarks/grad_norm.py
    (benchmarks/results/grad_norm.json).
    """
    n = flat.numel()
    full = n - n % block
    out = torch.zeros((), dtype=torch.float64, device=flat.device)
    if full:
        out += torch.linalg.vector_norm(flat[:full].view(-1, block), dim=1).double().square().sum()
    if full < n:
        out += torch.linalg.vector_norm(flat[full:]).double().square()
    return out


def grad_norm_and_nonfinite_ranks(shard_views: list[torch.Tensor], local_nonfinite: torch.Tensor,
                                  *, rank: int, dp: int, group) -> tuple[float, list[int]]:
    """(global L2 norm of the gradient, ranks whose local check found NaN/Inf).

    `shard_views`: this rank's fp32 shard of every grad bucket; `local_nonfinite`: 0-dim, 1.0 if
    this rank saw a non-finite bucket. Collective: every rank of `group` calls it once per step.
    """
    device = local_nonfinite.device
    stats = torch.zeros(1 + dp, dtype=torch.float64, device=device)   # [sumsq, flag per rank]
    for view in shard_views:
        if view.numel():
            stats[0] += sum_of_squares_fp64(view)
    stats[1 + rank] = local_nonfinite
    if dp > 1:  # one collective: SUM of sums of squares; per-rank flags (SUM == MAX)
        coll.run("all_reduce(grad norm + non-finite flags)",
                 lambda: dist.all_reduce(stats, group=group), rank)
    sumsq, *flags = stats.tolist()
    bad = [r for r, flag in enumerate(flags) if flag > 0]
    return math.sqrt(sumsq) if sumsq >= 0 else float("nan"), bad


def clip_coefficient(max_norm: float, norm: float) -> float:
    """Scale for the gradients, as `torch.nn.utils.clip_grad_norm_` (max_norm 0: no clipping)."""
    return max_norm / (norm + 1e-6) if max_norm > 0 else 1.0
