"""Evoformer / extra-MSA blocks (AF2 Alg. 6 and 18) under dynamic axial parallelism (DAP,
FastFold; NVIDIA ScaleFold): one sample split over the K ranks of a DAP group.

What is split where (K = 2; `|` = the split; S MSA rows, L residues, both padded to multiples of K):

    MSA m [S, L]       row attention (Alg. 7)   split by rows   S/K x L   + pair bias all-gathered
                       -- all-to-all -->
                       column attention (8/19), transition (9), outer product mean (10):
                                               split by columns S x L/K  + OPM operand all-gathered
                       -- all-to-all back at the end of the block -->
    pair z [L, L]      OPM update, triangle mult. outgoing (11), triangle attention starting (13):
                                               split by rows   L/K x L   + 2nd operand / bias gathered
                       triangle mult. incoming (12), triangle attention ending (14), transition (15):
                                               split by columns L x L/K  + 1st operand / bias gathered

Six all-to-alls per block (2 MSA, 4 pair) switch the split axis; the all-gathers bring the
operand an operation needs whole and reduce-scatter its gradient (`protdp.parallel.dap`). The
model never imports torch.distributed: the caller hands it an `AxialComm` (duck-typed here:
`padded`, `scatter`, `gather`, `gather_replicated`, `all_to_all`, `shard_of`).

Padding: S and L are padded to multiples of K with masked rows / residues; the masks keep padded
positions from changing real ones (see `protdp.model.evoformer`), and the result is cut back.
Dropout masks are drawn at the unpadded single-process shape by the block's own `SharedDropout`,
identically on every rank of the group (same RNG state), then padded and sliced to the local
shard, so a DAP run equals one process bit for bit in distribution and numerically up to fp
reassociation.
"""

from __future__ import annotations

import functools

import torch
import torch.utils.checkpoint
from einops import rearrange

from protdp.model.primitives import chunk_rows

ROWS, COLS = -3, -2   # split axes of m [*, S, L, C] and z [*, L, L, C]


def _pad_to(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """Zero-pad `dim` of x to `size`."""
    extra = size - x.shape[dim]
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def _dropout(module, x: torch.Tensor, real: tuple[int, int], split_dim: int, comm) -> torch.Tensor:
    """`module` (SharedDropout) applied to the local shard x [*, R, Q, C] (split along
    `split_dim`), with the mask the single process would draw for the unpadded [*, real R,
    real Q, C]."""
    if not module.training or module.p == 0.0:
        return x
    shape = list(x.shape[:-3]) + list(real) + [x.shape[-1]]
    shape[module.shared_dim] = 1
    scale = module(torch.ones(shape, dtype=x.dtype, device=x.device))   # keep / (1 - p)
    for dim in (ROWS, COLS):
        if dim != module.shared_dim:
            scale = _pad_to(scale, dim, comm.padded(real[dim + 3]))
    if split_dim != module.shared_dim:
        scale = comm.shard_of(scale, split_dim)
    return x * scale


def _row_attention(mod, m, z, mask_rows, cs, comm):
    """Alg. 7 on m split by rows [*, S/K, L, C_m], z split by rows [*, L/K, L, C_z]."""
    bias = rearrange(mod.linear_b(mod.norm_z(z)), "... i j h -> ... h i j")     # [*, H, L/K, L]
    bias = comm.gather(bias, -2, "row_bias_all_gather")                         # [*, H, L, L]
    return mod.attention(mod.norm_m(m), mask_rows, bias, cs)


def _outer_product_mean(mod, m, msa_mask, mask_cols, cs, comm):
    """Alg. 10 on m split by columns [*, S, L/K, C_m] -> z update split by rows [*, L/K, L, C_z]."""
    mask = mask_cols[..., None].to(m.dtype)
    mn = mod.norm(m)
    a = mod.linear_a(mn) * mask                                                 # [*, S, L/K, c]
    b = comm.gather(mod.linear_b(mn) * mask, -2, "opm_all_gather")             # [*, S, L, c]
    count = torch.einsum("...si,...sj->...ij", mask_cols, msa_mask)           # [*, L/K, L]

    def rows(a_t, count_rows):
        outer = torch.einsum("...isc,...sjd->...ijcd", a_t, b)
        out = mod.linear_out(rearrange(outer, "... c d -> ... (c d)"))
        return out / (count_rows[..., None] + 1e-3)

    return chunk_rows(rows, a.transpose(-2, -3), count, cs)


def _gated_operands(mod, z, mask):
    zn = mod.norm_in(z)
    mask = mask[..., None].to(z.dtype)
    a = torch.sigmoid(mod.linear_a_g(zn)) * mod.linear_a_p(zn) * mask
    b = torch.sigmoid(mod.linear_b_g(zn)) * mod.linear_b_p(zn) * mask
    return zn, a, b


def _tri_mul_outgoing(mod, z, mask_rows, comm):
    """Alg. 11 on z split by rows [*, L/K, L, C_z]: x_ij = sum_k a_ik b_jk needs every b_j."""
    zn, a, b = _gated_operands(mod, z, mask_rows)
    b = comm.gather(b, -3, "tri_mul_all_gather")                                # [*, L, L, c]
    x = torch.einsum("...ikc,...jkc->...ijc", a, b)                             # [*, L/K, L, c]
    return torch.sigmoid(mod.linear_g(zn)) * mod.linear_z(mod.norm_out(x))


def _tri_mul_incoming(mod, z, mask_cols, comm):
    """Alg. 12 on z split by columns [*, L, L/K, C_z]: x_ij = sum_k a_ki b_kj needs every a_i."""
    zn, a, b = _gated_operands(mod, z, mask_cols)
    a = comm.gather(a, -2, "tri_mul_all_gather")                                # [*, L, L, c]
    x = torch.einsum("...kic,...kjc->...ijc", a, b)                             # [*, L, L/K, c]
    return torch.sigmoid(mod.linear_g(zn)) * mod.linear_z(mod.norm_out(x))


def _tri_attention(mod, z, mask, cs, comm):
    """Alg. 13 on z split by rows (mask [*, L/K, L]) or Alg. 14 on z split by columns (mask
    [*, L, L/K]); the triangle bias is all-gathered."""
    if not mod.starting:
        z, mask = z.transpose(-2, -3), mask.transpose(-1, -2)                   # rows of z^T
    zn = mod.norm(z)
    bias = rearrange(mod.linear_b(zn), "... j k h -> ... h j k")               # [*, H, L/K, L]
    bias = comm.gather(bias, -2, "tri_att_bias_all_gather")                     # [*, H, L, L]
    out = mod.attention(zn, mask, bias, cs)
    return out if mod.starting else out.transpose(-2, -3)


def axial_block(block, m, z, msa_mask, pair_mask, comm, real_msa, real_pair):
    """One Evoformer block (Alg. 6 / 18) on m split by rows [*, S/K, L, C] and z split by rows
    [*, L/K, L, C_z]; full padded masks msa_mask [*, S, L], pair_mask [*, L, L]; returns both
    split the same way. `real_msa` = (S, L), `real_pair` = (L, L) unpadded (dropout shapes)."""
    if block.outer_product_first:
        raise NotImplementedError("DAP runs the monomer Evoformer order; AlphaFold-Multimer's "
                                  "outer-product-first blocks run on one rank (--dap-size 1)")
    cs = block.chunk_size
    mask_rows, mask_cols = comm.shard_of(msa_mask, -2), comm.shard_of(msa_mask, -1)
    pm_rows, pm_cols = comm.shard_of(pair_mask, -2), comm.shard_of(pair_mask, -1)

    m = m + _dropout(block.msa_row_dropout, _row_attention(block.msa_row, m, z, mask_rows, cs, comm),
                     real_msa, ROWS, comm)
    m = comm.all_to_all(m, COLS, ROWS, "msa_all_to_all")                        # [*, S, L/K, C]
    m = m + block.msa_col(m, mask_cols, cs)
    m = m + block.msa_transition(m, mask_cols, cs)
    z = z + _outer_product_mean(block.opm, m, msa_mask, mask_cols, cs, comm)
    m = comm.all_to_all(m, ROWS, COLS, "msa_all_to_all")                        # [*, S/K, L, C]

    z = z + _dropout(block.row_dropout, _tri_mul_outgoing(block.tri_mul_out, z, pm_rows, comm),
                     real_pair, ROWS, comm)
    z = comm.all_to_all(z, COLS, ROWS, "pair_all_to_all")                       # [*, L, L/K, C]
    z = z + _dropout(block.row_dropout, _tri_mul_incoming(block.tri_mul_in, z, pm_cols, comm),
                     real_pair, COLS, comm)
    z = comm.all_to_all(z, ROWS, COLS, "pair_all_to_all")                       # [*, L/K, L, C]
    z = z + _dropout(block.row_dropout, _tri_attention(block.tri_att_start, z, pm_rows, cs, comm),
                     real_pair, ROWS, comm)
    z = comm.all_to_all(z, COLS, ROWS, "pair_all_to_all")                       # [*, L, L/K, C]
    z = z + _dropout(block.col_dropout, _tri_attention(block.tri_att_end, z, pm_cols, cs, comm),
                     real_pair, COLS, comm)
    z = z + block.pair_transition(z, pm_cols, cs)
    z = comm.all_to_all(z, ROWS, COLS, "pair_all_to_all")                       # [*, L/K, L, C]
    return m, z


def run_blocks_axial(blocks, m, z, msa_mask, pair_mask, recompute: bool, comm):
    """`evoformer.run_blocks` under DAP: pad, keep this rank's shard, run the blocks, gather.

    m [*, S, L, C], z [*, L, L, C_z] (the same on every rank of the group) -> the same shapes,
    whole on every rank; the structure module and heads then run on the gathered result."""
    S, L = m.shape[-3], m.shape[-2]
    Sp, Lp = comm.padded(S), comm.padded(L)
    msa_mask = _pad_to(_pad_to(msa_mask, -2, Sp), -1, Lp)                     # [*, Sp, Lp]
    pair_mask = _pad_to(_pad_to(pair_mask, -2, Lp), -1, Lp)                   # [*, Lp, Lp]
    m = comm.scatter(_pad_to(_pad_to(m, ROWS, Sp), COLS, Lp), ROWS)           # [*, Sp/K, Lp, C]
    z = comm.scatter(_pad_to(_pad_to(z, ROWS, Lp), COLS, Lp), ROWS)           # [*, Lp/K, Lp, C_z]
    for block in blocks:
        fn = functools.partial(axial_block, block, comm=comm, real_msa=(S, L), real_pair=(L, L))
        if recompute and torch.is_grad_enabled():
            m, z = torch.utils.checkpoint.checkpoint(fn, m, z, msa_mask, pair_mask,
                                                     use_reentrant=False)
        else:
            m, z = fn(m, z, msa_mask, pair_mask)
    m = comm.gather_replicated(m, ROWS)[..., :S, :L, :]
    z = comm.gather_replicated(z, ROWS)[..., :L, :L, :]
    return m, z


def dap_sharded_parameters(model) -> list:
    """Parameters used inside DAP-split blocks (their per-rank gradients are partial sums that
    `protdp.parallel.dap.reduce_dap_grads` adds up over the group); every other parameter runs
    on whole tensors on every rank and already has the full gradient."""
    stacks = [model.evoformer] + ([model.extra_msa_stack] if hasattr(model, "extra_msa_stack") else [])
    return [p for stack in stacks for p in stack.blocks.parameters() if p.requires_grad]
