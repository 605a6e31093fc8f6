"""In-place, row-streamed inference of one Evoformer block (AF2 Alg. 6 / 18 without a graph).

Same values as `EvoformerBlock.forward` (fp32 rounding apart), with the memory of the pair
representation z [*, L, L, C_z] cut to: the block's own copy of z (the caller's z is never
written), one full [*, c, L, L] triangle-multiplication operand, the [*, H, L, L] biases, and
temporaries of `chunk_size` rows. How (AF2 supplement §1.11.8 "chunking", taken further):

- Every residual update is added in place, `chunk_size` rows at a time, into the block's copy
  (`add_rows_`). That is exact when the update of a row chunk reads only those rows of the
  tensor plus operands computed before the first write: true of row attention with pair bias
  (rows of m + the bias), column attention and triangle attention around the ending node (on
  the transposed view: columns are rows there), triangle attention around the starting node
  (rows of z + the triangle bias), the transitions (position-wise) and the outer product mean
  (its operands come from m, not z).
- The pair / triangle biases [*, H, L, L] are computed `chunk_size` rows at a time (no full
  LayerNorm(z) temporary).
- Triangle multiplication (Alg. 11 / 12): the outgoing update of row i is
  x_i. = sum_k a_ik b_.k, so only b must be whole: it is computed first (one [*, c, L, L]
  operand, in the matmul layout), then a is computed from each row chunk of z just before
  that chunk is overwritten. The incoming update is the same on the transposed view
  (x^T_j. = sum_k b_kj a_k. : a whole, b streamed from the rows of z^T, i.e. columns of z).

`inference_block(block, m, z, msa_mask, pair_mask)` duck-types `protdp.model.evoformer
.EvoformerBlock` (it never imports it: no cycle); it is what the block's forward runs in eval
mode without autograd.
"""

from __future__ import annotations

from typing import Callable

import torch
from einops import rearrange


def add_rows_(x: torch.Tensor, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
              mask: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """x[..., rows, :, :] += fn(x rows, mask rows) for chunks of `chunk_size` rows (dim -3 of x
    [*, R, Q, C], dim -2 of mask [*, R, Q]), in place; x may be a (transposed) view. Exact when
    fn of a row chunk reads only those rows of x (see the module docstring)."""
    for start in range(0, x.shape[-3], chunk_size):
        n = min(chunk_size, x.shape[-3] - start)
        rows = x.narrow(-3, start, n)
        rows += fn(rows, mask.narrow(-2, start, n))
    return x


def pair_bias(norm, linear, z: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """linear(norm(z)) as [*, H, L, L] (head first), `chunk_size` rows of z [*, L, L, C] at a time."""
    out = None
    for start in range(0, z.shape[-3], chunk_size):
        n = min(chunk_size, z.shape[-3] - start)
        b = linear(norm(z.narrow(-3, start, n)))                           # [*, n, L, H]
        if out is None:
            out = b.new_empty(z.shape[:-3] + (b.shape[-1],) + z.shape[-3:-1])
        out.narrow(-2, start, n).copy_(rearrange(b, "... i j h -> ... h i j"))
    return out


def _gated(linear_p, linear_g, zn, mask_rows):
    """sigmoid(linear_g(zn)) * linear_p(zn) * mask on normed rows zn [*, n, L, C_z] -> [*, c, n, L]."""
    x = linear_p(zn)
    x.mul_(torch.sigmoid_(linear_g(zn))).mul_(mask_rows[..., None].to(x.dtype))
    return x.movedim(-1, -3)


def triangle_multiplication_(mod, z: torch.Tensor, pair_mask: torch.Tensor,
                             chunk_size: int) -> torch.Tensor:
    """z += TriangleMultiplication `mod`(z) in place (Alg. 11 outgoing, Alg. 12 incoming)."""
    if mod.outgoing:   # x_ij = sum_k a_ik b_jk on z: b whole, a streamed
        y, mask = z, pair_mask
        whole, streamed = (mod.linear_b_p, mod.linear_b_g), (mod.linear_a_p, mod.linear_a_g)
    else:              # x_ij = sum_k a_ki b_kj = (on y = z^T) sum_k b^T_jk a^T_ik: a whole
        y, mask = z.transpose(-2, -3), pair_mask.transpose(-1, -2)
        whole, streamed = (mod.linear_a_p, mod.linear_a_g), (mod.linear_b_p, mod.linear_b_g)
    n_res = y.shape[-3]
    full = None                                                             # [*, c, L, K]
    for start in range(0, n_res, chunk_size):
        n = min(chunk_size, n_res - start)
        part = _gated(*whole, mod.norm_in(y.narrow(-3, start, n)), mask.narrow(-2, start, n))
        if full is None:
            full = part.new_empty(part.shape[:-2] + (n_res, n_res))
        full.narrow(-2, start, n).copy_(part)
    full_t = full.transpose(-1, -2)                                         # [*, c, K, L]

    def update(y_rows, mask_rows):
        zn = mod.norm_in(y_rows)
        x = torch.matmul(_gated(*streamed, zn, mask_rows), full_t)          # [*, c, n, L]
        x = mod.linear_z(mod.norm_out(x.movedim(-3, -1)))                   # [*, n, L, C_z]
        return x.mul_(torch.sigmoid_(mod.linear_g(zn)))

    return add_rows_(y, update, mask, chunk_size)


def triangle_attention_(mod, z: torch.Tensor, pair_mask: torch.Tensor, chunk_size: int):
    """z += TriangleAttention `mod`(z) in place (Alg. 13 starting node, 14 ending node)."""
    if not mod.starting:
        z, pair_mask = z.transpose(-2, -3), pair_mask.transpose(-1, -2)
    bias = pair_bias(mod.norm, mod.linear_b, z, chunk_size)                 # [*, H, L, L]
    return add_rows_(z, lambda rows, mask: mod.attention._attend(mod.norm(rows), mask, bias),
                     pair_mask, chunk_size)


def outer_product_mean_(mod, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor,
                        chunk_size: int) -> torch.Tensor:
    """z += OuterProductMean `mod`(m) in place, `chunk_size` rows of z at a time."""
    a_t, b, count = mod.operands(m, msa_mask)                               # [*, L, S, c], ...
    for start in range(0, z.shape[-3], chunk_size):
        n = min(chunk_size, z.shape[-3] - start)
        z.narrow(-3, start, n).add_(mod.rows(a_t.narrow(-3, start, n), b, count.narrow(-2, start, n)))
    return z


def inference_block(block, m, z, msa_mask, pair_mask):
    """EvoformerBlock.forward without autograd or dropout (eval), in place on copies of m and z."""
    size = block.chunk_size or max(m.shape[-3], m.shape[-2], z.shape[-3])
    m, z = m.clone(), z.clone()
    if block.outer_product_first:
        outer_product_mean_(block.opm, m, z, msa_mask, size)
    row = block.msa_row
    bias = pair_bias(row.norm_z, row.linear_b, z, size)                    # [*, H, L, L]
    add_rows_(m, lambda rows, mask: row.attention._attend(row.norm_m(rows), mask, bias),
              msa_mask, size)
    del bias
    col = block.msa_col
    if hasattr(col, "attention"):      # Alg. 8
        add_rows_(m.transpose(-2, -3), lambda rows, mask: col.attention._attend(col.norm(rows), mask, None),
                  msa_mask.transpose(-1, -2), size)
    else:                              # Alg. 19 (extra-MSA stack)
        add_rows_(m.transpose(-2, -3), lambda rows, mask: col._attend(col.norm(rows), mask),
                  msa_mask.transpose(-1, -2), size)
    add_rows_(m, block.msa_transition._transition, msa_mask, size)
    if not block.outer_product_first:
        outer_product_mean_(block.opm, m, z, msa_mask, size)
    triangle_multiplication_(block.tri_mul_out, z, pair_mask, size)
    triangle_multiplication_(block.tri_mul_in, z, pair_mask, size)
    triangle_attention_(block.tri_att_start, z, pair_mask, size)
    triangle_attention_(block.tri_att_end, z, pair_mask, size)
    add_rows_(z, block.pair_transition._transition, pair_mask, size)
    return m, z
