"""Evoformer stack (AF2 supplement §1.6, Algorithms 6-15) and extra-MSA stack (Alg. 18-19).

Every residual branch ends in a zero-initialised ("final") linear layer, so each block is the
identity at initialisation. Masks: `msa_mask` [*, N_seq, N_res] masks attention keys and the
outer-product-mean rows; `pair_mask` [*, N_res, N_res] masks triangle updates and attention keys,
so padded rows/residues never change the outputs at real positions. As in AlphaFold, transitions
do not mask, and the outer product mean divides by (1e-3 + shared rows) without a special case,
so padded rows and residues carry exactly AlphaFold's values too.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.utils.checkpoint
from einops import rearrange

from protdp.model.attention import TRANSIENT_ELEMENTS
from protdp.model.axial import run_blocks_axial
from protdp.model.config import ModelConfig
from protdp.model.evoformer_inference import inference_block
from protdp.model.precision import active_autocast_dtype, replay_autocast
from protdp.model.primitives import (Attention, LayerNorm, Linear, MASK_NEG, SharedDropout,
                                     Transition, chunk_rows, fused_projection_enabled,
                                     norm_project)


class MSARowAttentionWithPairBias(nn.Module):
    """Algorithm 7: gated row-wise self-attention on the MSA, biased by the pair representation."""

    def __init__(self, c_m: int, c_z: int, c_hidden: int, n_heads: int):
        super().__init__()
        self.norm_m = LayerNorm(c_m)
        self.norm_z = LayerNorm(c_z)
        self.linear_b = Linear(c_z, n_heads, bias=False)
        self.attention = Attention(c_m, c_hidden, n_heads)

    def forward(self, m, z, msa_mask, chunk_size=None):
        # m [*, S, L, C_m], z [*, L, L, C_z], msa_mask [*, S, L]
        bias, = norm_project(self.norm_z, [self.linear_b], z, channels_first=[True])  # [*, H, L, L]
        if fused_projection_enabled() and chunk_size is None:   # training: one fused projection
            q, k, v, g = norm_project(self.norm_m, self.attention.projections, m)
            return self.attention.core(q, k, v, g, msa_mask, bias)
        return self.attention(self.norm_m(m), msa_mask, bias, chunk_size)


class MSAColumnAttention(nn.Module):
    """Algorithm 8: gated column-wise self-attention on the MSA (over sequences)."""

    def __init__(self, c_m: int, c_hidden: int, n_heads: int):
        super().__init__()
        self.norm = LayerNorm(c_m)
        self.attention = Attention(c_m, c_hidden, n_heads)

    def forward(self, m, msa_mask, chunk_size=None):
        m_t = m.transpose(-2, -3)                                    # [*, L, S, C_m]
        if fused_projection_enabled() and chunk_size is None:   # training: one fused projection
            q, k, v, g = norm_project(self.norm, self.attention.projections, m_t)
            return self.attention.core(q, k, v, g, msa_mask.transpose(-1, -2), None).transpose(-2, -3)
        out = self.attention(self.norm(m_t), msa_mask.transpose(-1, -2), None, chunk_size)
        return out.transpose(-2, -3)


class MSAColumnGlobalAttention(nn.Module):
    """Algorithm 19: global column attention of the extra-MSA stack (one averaged query)."""

    def __init__(self, c_e: int, c_hidden: int, n_heads: int):
        super().__init__()
        self.c_hidden, self.n_heads = c_hidden, n_heads
        self.norm = LayerNorm(c_e)
        self.linear_q = Linear(c_e, c_hidden * n_heads, bias=False, init="glorot")
        self.linear_k = Linear(c_e, c_hidden, bias=False, init="glorot")
        self.linear_v = Linear(c_e, c_hidden, bias=False, init="glorot")
        self.linear_g = Linear(c_e, c_hidden * n_heads, init="gating")
        self.linear_o = Linear(c_hidden * n_heads, c_e, init="final")

    def _attend(self, e, mask):
        # e [*, L, S, C_e] (LayerNorm-ed, columns as rows), mask [*, L, S]
        return self._core(e, self.linear_k(e), self.linear_v(e), self.linear_g(e), mask)

    def _core(self, e, k, v, g, mask):
        """e [*, L, S, C_e] (LayerNorm-ed; read only by the query average), k, v [*, L, S, c]
        and the gate's projection g [*, L, S, H*c] -> [*, L, S, C_e]."""
        mask_f = mask[..., None].to(e.dtype)
        q_avg = (e * mask_f).sum(-2) / (mask_f.sum(-2) + 1e-10)       # [*, L, C_e]
        q = rearrange(self.linear_q(q_avg), "... (h c) -> ... h c", h=self.n_heads)
        q = q / self.c_hidden ** 0.5                                  # [*, L, H, c]
        logits = torch.einsum("...hc,...sc->...hs", q, k).float()    # [*, L, H, S]
        logits = logits.masked_fill(mask[..., None, :] == 0, MASK_NEG)
        w = torch.softmax(logits, -1).to(v.dtype)
        o = torch.einsum("...hs,...sc->...hc", w, v)                  # [*, L, H, c]
        g = rearrange(torch.sigmoid(g), "... s (h c) -> ... s h c", h=self.n_heads)
        o = rearrange(g * o[..., None, :, :], "... s h c -> ... s (h c)")
        return self.linear_o(o)                                       # [*, L, S, C_e]

    def forward(self, e, msa_mask, chunk_size=None):
        e_t, mask_t = e.transpose(-2, -3), msa_mask.transpose(-1, -2)   # [*, L, S, C_e], [*, L, S]
        if fused_projection_enabled() and chunk_size is None:
            # training: k, v, g from one fused LayerNorm -> projection, which keeps e (not
            # LayerNorm(e) nor, under autocast, one bf16 copy of it per Linear) for backward;
            # the query average reads LayerNorm(e) without keeping it (a masked sum)
            k, v, g = norm_project(self.norm, [self.linear_k, self.linear_v, self.linear_g], e_t)
            return self._core(self.norm(e_t), k, v, g, mask_t).transpose(-2, -3)
        out = chunk_rows(self._attend, self.norm(e_t), mask_t, chunk_size)
        return out.transpose(-2, -3)


# outer-product elements formed at a time by _OuterLinear, forward and backward (fp32: 16 MiB)
OUTER_CHUNK_ELEMENTS = TRANSIENT_ELEMENTS


class _OuterLinear(torch.autograd.Function):
    """y_ij = vec(sum_s a_si (x) b_sj) W^T + bias without storing the [*, I, J, c*d] outer
    products for backward: they are formed a few rows i at a time, in forward and again in
    backward. The outer
    products are laid out [c, I*J, d] (one GEMM of a^T [c*I, S] and b [S, J*d], no permuted
    copy), so the projection is a sum over c of [I*J, d] x [d, C_z] GEMMs, and the backward
    writes the projection's gradient in the same layout, so its GEMMs read contiguous operands."""

    @staticmethod
    def forward(ctx, a_t, b, weight, bias):
        # a_t [*, I, S, c], b [*, S, J, d], weight [C_z, c*d] -> [*, I, J, C_z]
        ctx.save_for_backward(a_t, b, weight)
        ctx.compute_dtype = active_autocast_dtype(a_t.device.type)
        dtype = ctx.compute_dtype or a_t.dtype
        n_i, n_s, c = a_t.shape[-3:]
        n_j, d, n_z = b.shape[-2], b.shape[-1], weight.shape[0]
        with torch.autocast(a_t.device.type, enabled=False):
            w_t = weight.to(dtype).view(n_z, c, d).permute(1, 2, 0).contiguous()   # [c, d, C_z]
            a3 = a_t.to(dtype).reshape(-1, n_i, n_s, c)
            b3 = b.to(dtype).reshape(-1, n_s, n_j * d)
            y = a3.new_empty(a3.shape[0], n_i * n_j, n_z)
            rows = max(1, OUTER_CHUNK_ELEMENTS // (n_j * c * d))
            for n in range(a3.shape[0]):
                for start in range(0, n_i, rows):       # a few rows i at a time, as backward
                    i = min(rows, n_i - start)
                    outer = _outer_channels_first(a3[n, start:start + i], b3[n], d)  # [c, i*J, d]
                    y_rows = y[n, start * n_j:(start + i) * n_j]                      # [i*J, C_z]
                    torch.addmm(bias.to(dtype), outer[0], w_t[0], out=y_rows)
                    for k in range(1, c):
                        y_rows.addmm_(outer[k], w_t[k])
        return y.view(a_t.shape[:-3] + (n_i, n_j, n_z))

    @staticmethod
    def backward(ctx, d_y):
        with torch.autocast(d_y.device.type, enabled=False):
            return _OuterLinear._backward(ctx, d_y)

    @staticmethod
    def _backward(ctx, d_y):
        a_t, b, weight = ctx.saved_tensors
        dtype = ctx.compute_dtype or a_t.dtype
        n_i, n_s, c = a_t.shape[-3:]
        n_j, d, n_z = b.shape[-2], b.shape[-1], weight.shape[0]
        rows = max(1, OUTER_CHUNK_ELEMENTS // (n_j * c * d))
        a3 = a_t.to(dtype).reshape(-1, n_i, n_s, c)
        b3 = b.to(dtype).reshape(-1, n_s, n_j * d)                                   # [B, S, J*d]
        d_y3 = d_y.to(dtype).reshape(-1, n_i, n_j, n_z)
        w = weight.to(dtype)
        d_a = torch.empty_like(a_t).view(-1, n_i, n_s, c)
        d_b = torch.zeros_like(b).view(-1, n_s, n_j * d)
        d_w = torch.zeros_like(weight).view(n_z, c, d)
        w_c = w.view(n_z, c, d).permute(1, 0, 2).contiguous()                        # [c, C_z, d]
        for n in range(a3.shape[0]):
            for start in range(0, n_i, rows):
                i = min(rows, n_i - start)
                a_ci = a3[n, start:start + i].permute(2, 0, 1).reshape(c * i, n_s)   # [c*i, S]
                outer = _outer_channels_first(a3[n, start:start + i], b3[n], d)      # [c, i*J, d]
                d_rows = d_y3[n, start:start + i].reshape(i * n_j, n_z)               # [i*J, C_z]
                # [c, d, C_z]: one batched GEMM (d_rows broadcast over c, not copied)
                d_w.add_(torch.bmm(outer.transpose(1, 2), d_rows.expand(c, *d_rows.shape))
                         .permute(2, 0, 1))
                del outer
                # d_outer [c, i*J, d] = [c*i, J*d], the projection's gradient written channels
                # first by one batched GEMM (d_rows broadcast over c): no permuted copy
                d_outer = torch.bmm(d_rows.expand(c, *d_rows.shape), w_c).view(c * i, n_j * d)
                d_a[n, start:start + i].copy_(d_outer.mm(b3[n].t()).view(c, i, n_s).permute(1, 2, 0))
                d_b[n].add_(a_ci.t().mm(d_outer))
        d_bias = d_y.reshape(-1, d_y.shape[-1]).sum(0, dtype=weight.dtype)
        return d_a.view(a_t.shape), d_b.view(b.shape), d_w.view(weight.shape), d_bias


def _outer_channels_first(a_rows: torch.Tensor, b2: torch.Tensor, d: int) -> torch.Tensor:
    """a_rows [I, S, c], b2 [S, J*d] -> outer products [c, I*J, d] (one GEMM, no copy of it)."""
    n_i, n_s, c = a_rows.shape
    a_ci = a_rows.permute(2, 0, 1).reshape(c * n_i, n_s)                             # [c*I, S]
    return a_ci.mm(b2).view(c, -1, d)


class OuterProductMean(nn.Module):
    """Algorithm 10: MSA -> pair update by the mean outer product over sequences."""

    def __init__(self, c_m: int, c_z: int, c_hidden: int):
        super().__init__()
        self.norm = LayerNorm(c_m)
        self.linear_a = Linear(c_m, c_hidden)
        self.linear_b = Linear(c_m, c_hidden)
        self.linear_out = Linear(c_hidden * c_hidden, c_z, init="final")

    def operands(self, m, msa_mask):
        """a^T [*, L, S, c], b [*, S, L, c] (masked projections of LayerNorm(m)) and the shared
        row count [*, L, L]."""
        mask = msa_mask[..., None].to(m.dtype)                        # [*, S, L, 1]
        a, b = norm_project(self.norm, [self.linear_a, self.linear_b], m)
        # mask in the projections' dtype: under autocast a, b stay bf16 (an fp32 mask would
        # promote them, and _OuterLinear would keep fp32 copies for backward)
        mask = mask.to(a.dtype)
        a, b = a * mask, b * mask                                     # [*, S, L, c]
        count = torch.einsum("...si,...sj->...ij", msa_mask, msa_mask)       # [*, L, L] shared rows
        return a.transpose(-2, -3), b, count

    def rows(self, a_t, b, count_rows):
        """a_t [*, I, S, c] (a chunk of residues i), count_rows [*, I, L] -> [*, I, L, C_z]."""
        # AF2: (outer . W + b) / (1e-3 + shared rows); pairs without a shared row (padding,
        # an all-padding extra MSA) get b / 1e-3, exactly as AlphaFold computes them
        if fused_projection_enabled():   # training: the outer products are not stored
            out = _OuterLinear.apply(a_t, b, self.linear_out.weight, self.linear_out.bias)
        else:
            outer = torch.einsum("...isc,...sjd->...ijcd", a_t, b)
            out = self.linear_out(rearrange(outer, "... c d -> ... (c d)"))
        return out / (count_rows[..., None] + 1e-3)

    def forward(self, m, msa_mask, chunk_size=None):
        a_t, b, count = self.operands(m, msa_mask)
        return chunk_rows(lambda a_rows, c_rows: self.rows(a_rows, b, c_rows), a_t, count, chunk_size)


def _oriented(x: torch.Tensor, outgoing: bool) -> torch.Tensor:
    """x [*, c, L, L] (channels first, x[c, p, q] = x_pq) -> the [*, c, I, K] operand of the
    product: x_ik (outgoing) or x_ki (incoming, a transposed view the batched GEMM reads)."""
    return x if outgoing else x.transpose(-1, -2)


class _GatedTriangleProduct(torch.autograd.Function):
    """x_ij = sum_k a_ik b_jk (outgoing) or sum_k a_ki b_kj (incoming), a = sigmoid(a_g) * a_p
    * mask (b alike), on channels-first projections [*, c, L, L] as the fused LayerNorm ->
    projection writes them (no transposed copies: incoming edges read transposed views), storing
    only the projections for backward: the gated operands are recomputed there."""

    @staticmethod
    def forward(ctx, a_p, a_g, b_p, b_g, mask, outgoing):
        # a_p, a_g, b_p, b_g [*, c, L, L], mask [*, 1, L, L] -> x [*, L, L, c] (contiguous)
        a = torch.sigmoid(a_g).mul_(a_p).mul_(mask)
        b = torch.sigmoid(b_g).mul_(b_p).mul_(mask)
        ctx.save_for_backward(a_p, a_g, b_p, b_g, mask)
        ctx.outgoing = outgoing
        ctx.compute_dtype = active_autocast_dtype(a_p.device.type)
        ctx.dtypes = [t.dtype for t in (a_p, a_g, b_p, b_g)]
        x = torch.matmul(_oriented(a, outgoing), _oriented(b, outgoing).transpose(-1, -2))
        return x.movedim(-3, -1).contiguous()                                   # [*, I, J, c]

    @staticmethod
    def backward(ctx, d_x):
        with replay_autocast(d_x.device.type, ctx.compute_dtype):
            grads = _GatedTriangleProduct._backward(ctx, d_x)
        return tuple(g.to(dtype) for g, dtype in zip(grads[:4], ctx.dtypes)) + (None, None)

    @staticmethod
    def _backward(ctx, d_x):
        a_p, a_g, b_p, b_g, mask = ctx.saved_tensors
        d_x = d_x.movedim(-1, -3).contiguous()                                   # [*, c, I, J]

        def back(p, g, d):
            # d [*, c, L, L] (gradient of the gated operand) -> d_p, d_g [*, c, L, L]
            d = d * mask
            s = torch.sigmoid(g)
            d_p = d * s
            d_g = d.mul_(p).mul_(s).mul_(1 - s)
            return d_p, d_g

        # outgoing: x = a b^T, d_a = d_x b, d_b = d_x^T a; incoming: x = a^T b, d_a = b d_x^T,
        # d_b = a d_x (all [*, c, L, L], channels first as the projections)
        b = torch.sigmoid(b_g).mul_(b_p).mul_(mask)
        d_a = torch.matmul(d_x, b) if ctx.outgoing else torch.matmul(b, d_x.transpose(-1, -2))
        del b
        d_a_p, d_a_g = back(a_p, a_g, d_a)
        del d_a
        a = torch.sigmoid(a_g).mul_(a_p).mul_(mask)
        d_b = torch.matmul(d_x.transpose(-1, -2), a) if ctx.outgoing else torch.matmul(a, d_x)
        del a
        d_b_p, d_b_g = back(b_p, b_g, d_b)
        return d_a_p, d_a_g, d_b_p, d_b_g, None, None


class TriangleMultiplication(nn.Module):
    """Algorithms 11 (outgoing edges) and 12 (incoming edges)."""

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool):
        super().__init__()
        self.outgoing = outgoing
        self.norm_in = LayerNorm(c_z)
        self.linear_a_p = Linear(c_z, c_hidden)
        self.linear_a_g = Linear(c_z, c_hidden, init="gating")
        self.linear_b_p = Linear(c_z, c_hidden)
        self.linear_b_g = Linear(c_z, c_hidden, init="gating")
        self.linear_g = Linear(c_z, c_z, init="gating")
        self.norm_out = LayerNorm(c_hidden)
        self.linear_z = Linear(c_hidden, c_z, init="final")

    inference_chunk_size: int | None = None
    """Output rows computed at a time without autograd (ModelConfig.chunk_size, set by
    protdp.model.primitives.set_inference_chunk_size)."""

    def forward(self, z, pair_mask):
        # z [*, L, L, C_z], pair_mask [*, L, L]
        mask = pair_mask[..., None].to(z.dtype)
        if not torch.is_grad_enabled():
            return self._inference(self.norm_in(z), mask)
        fused = fused_projection_enabled()   # the gated operands are recomputed in backward
        a_p, a_g, b_p, b_g, g = norm_project(self.norm_in, [
            self.linear_a_p, self.linear_a_g, self.linear_b_p, self.linear_b_g, self.linear_g], z,
            channels_first=[fused] * 4 + [False])        # fused: a_p..b_g [*, c, L, L]
        if fused:
            x = _GatedTriangleProduct.apply(a_p, a_g, b_p, b_g, mask.movedim(-1, -3), self.outgoing)
        else:
            a = torch.sigmoid(a_g) * a_p * mask                            # [*, L, L, c]
            b = torch.sigmoid(b_g) * b_p * mask
            if self.outgoing:
                x = torch.einsum("...ikc,...jkc->...ijc", a, b)
            else:
                x = torch.einsum("...kic,...kjc->...ijc", a, b)
        return torch.sigmoid(g) * norm_project(self.norm_out, [self.linear_z], x)[0]

    def _inference(self, z, mask):
        """Same values without a graph: gates applied in place, and the product, output norm,
        projection and gate evaluated `inference_chunk_size` output rows at a time, so the [*, L, L, c]
        temporaries are one chunk instead of the whole map."""
        def gated(linear_p, linear_g):
            x = linear_p(z)
            x.mul_(torch.sigmoid_(linear_g(z))).mul_(mask)                  # [*, L, L, c]
            # incoming: x[i, j] = sum_k a[k, i] b[k, j], the outgoing form on transposes
            return x if self.outgoing else x.transpose(-2, -3)

        # channels first (one batched matmul per chunk on contiguous operands); each
        # [*, L, L, c] projection is freed as soon as its permuted copy exists
        a = gated(self.linear_a_p, self.linear_a_g).movedim(-1, -3).contiguous()       # [*, c, I, K]
        b = gated(self.linear_b_p, self.linear_b_g).movedim(-1, -3).transpose(-1, -2).contiguous()
        n = z.shape[-3]
        size = self.inference_chunk_size or n
        out = None
        for start in range(0, n, size):
            rows = slice(start, start + size)
            x = torch.matmul(a[..., rows, :], b).movedim(-3, -1)           # [*, I, J, c]
            x = self.linear_z(self.norm_out(x))
            x.mul_(torch.sigmoid_(self.linear_g(z[..., rows, :, :])))
            if out is None:
                out = x.new_empty(z.shape[:-1] + x.shape[-1:])
            out[..., rows, :, :] = x
        return out


class TriangleAttention(nn.Module):
    """Algorithms 13 (around the starting node) and 14 (around the ending node)."""

    def __init__(self, c_z: int, c_hidden: int, n_heads: int, starting: bool):
        super().__init__()
        self.starting = starting
        self.norm = LayerNorm(c_z)
        self.linear_b = Linear(c_z, n_heads, bias=False)
        self.attention = Attention(c_z, c_hidden, n_heads)

    def forward(self, z, pair_mask, chunk_size=None):
        if not self.starting:  # ending node = starting node on the transposed pair rep
            z, pair_mask = z.transpose(-2, -3), pair_mask.transpose(-1, -2)
        if fused_projection_enabled() and chunk_size is None:   # training: one fused projection
            *qkvg, bias = norm_project(self.norm, self.attention.projections + [self.linear_b], z,
                                       channels_first=[False] * 4 + [True])   # bias [*, H, L, L]
            out = self.attention.core(*qkvg, pair_mask, bias)
        else:
            z = self.norm(z)
            bias = rearrange(self.linear_b(z), "... j k h -> ... h j k")   # [*, H, L, L]
            out = self.attention(z, pair_mask, bias, chunk_size)         # [*, L, L, C_z]
        return out if self.starting else out.transpose(-2, -3)


class EvoformerBlock(nn.Module):
    """Algorithm 6 (and Alg. 18 for the extra-MSA stack with `global_column=True`).
    `outer_product_first`: AlphaFold-Multimer's order (the outer product mean updates the pair
    before the MSA attention, `outer_product_mean.first`)."""

    outer_product_first = False

    def __init__(self, cfg: ModelConfig, c_m: int, c_hidden_msa: int, global_column: bool = False):
        super().__init__()
        self.msa_row = MSARowAttentionWithPairBias(c_m, cfg.c_z, c_hidden_msa, cfg.msa_heads)
        self.msa_row_dropout = SharedDropout(cfg.msa_dropout, shared_dim=-3)
        if global_column:
            self.msa_col = MSAColumnGlobalAttention(c_m, c_hidden_msa, cfg.msa_heads)
        else:
            self.msa_col = MSAColumnAttention(c_m, c_hidden_msa, cfg.msa_heads)
        self.msa_transition = Transition(c_m, cfg.transition_n)
        self.opm = OuterProductMean(c_m, cfg.c_z, cfg.c_hidden_opm)
        self.tri_mul_out = TriangleMultiplication(cfg.c_z, cfg.c_hidden_tri_mul, outgoing=True)
        self.tri_mul_in = TriangleMultiplication(cfg.c_z, cfg.c_hidden_tri_mul, outgoing=False)
        self.tri_att_start = TriangleAttention(cfg.c_z, cfg.c_hidden_tri_att, cfg.pair_heads, True)
        self.tri_att_end = TriangleAttention(cfg.c_z, cfg.c_hidden_tri_att, cfg.pair_heads, False)
        self.pair_transition = Transition(cfg.c_z, cfg.transition_n)
        self.row_dropout = SharedDropout(cfg.pair_dropout, shared_dim=-3)
        self.col_dropout = SharedDropout(cfg.pair_dropout, shared_dim=-2)
        self.chunk_size = cfg.chunk_size

    def forward(self, m, z, msa_mask, pair_mask):
        # m [*, S, L, C_m], z [*, L, L, C_z]
        if not torch.is_grad_enabled() and not self.training:
            # same values, in place on copies, chunk_size rows at a time (evoformer_inference)
            return inference_block(self, m, z, msa_mask, pair_mask)
        cs = self.chunk_size
        if self.outer_product_first:
            z = z + self.opm(m, msa_mask, cs)
        m = m + self.msa_row_dropout(self.msa_row(m, z, msa_mask, cs))
        m = m + self.msa_col(m, msa_mask, cs)
        m = m + self.msa_transition(m, msa_mask, cs)
        if not self.outer_product_first:
            z = z + self.opm(m, msa_mask, cs)
        z = z + self.row_dropout(self.tri_mul_out(z, pair_mask))
        z = z + self.row_dropout(self.tri_mul_in(z, pair_mask))
        z = z + self.row_dropout(self.tri_att_start(z, pair_mask, cs))
        z = z + self.col_dropout(self.tri_att_end(z, pair_mask, cs))
        z = z + self.pair_transition(z, pair_mask, cs)
        return m, z


def run_blocks(blocks: nn.ModuleList, m, z, msa_mask, pair_mask, recompute: bool, axial=None):
    """Apply blocks in order; with `recompute`, each block's activations are recomputed in
    backward (torch.utils.checkpoint; dropout RNG state is replayed). With an `axial`
    communicator the blocks run split over its DAP group (`protdp.model.axial`)."""
    if axial is not None:
        return run_blocks_axial(blocks, m, z, msa_mask, pair_mask, recompute, axial)
    for block in blocks:
        if recompute and torch.is_grad_enabled():
            m, z = torch.utils.checkpoint.checkpoint(block, m, z, msa_mask, pair_mask,
                                                     use_reentrant=False)
        else:
            m, z = block(m, z, msa_mask, pair_mask)
    return m, z


class EvoformerStack(nn.Module):
    """Algorithm 6 stack; the single representation is a projection of the first MSA row."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.blocks = nn.ModuleList(EvoformerBlock(cfg, cfg.c_m, cfg.c_hidden_msa_att)
                                    for _ in range(cfg.n_blocks))
        self.linear_s = Linear(cfg.c_m, cfg.c_s)
        self.recompute = cfg.recompute
        self.axial = None   # DAP communicator (AlphaFoldModel.set_axial_comm), None = one rank

    def forward(self, m, z, msa_mask, pair_mask):
        m, z = run_blocks(self.blocks, m, z, msa_mask, pair_mask, self.recompute, self.axial)
        s = self.linear_s(m[..., 0, :, :])                             # [*, L, C_s]
        return m, z, s


class ExtraMSAStack(nn.Module):
    """Algorithm 18: extra-MSA stack; only the pair representation is kept."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.blocks = nn.ModuleList(EvoformerBlock(cfg, cfg.c_e, cfg.c_hidden_extra_att,
                                                   global_column=True)
                                    for _ in range(cfg.n_extra_blocks))
        self.recompute = cfg.recompute
        self.axial = None   # DAP communicator, as in EvoformerStack

    def forward(self, e, z, msa_mask, pair_mask):
        _, z = run_blocks(self.blocks, e, z, msa_mask, pair_mask, self.recompute, self.axial)
        return z
