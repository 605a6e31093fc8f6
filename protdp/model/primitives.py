"""Building blocks shared by the Evoformer and the structure module (AF2 supplement §1.11).

- `Linear` with the AF2 initialisers (§1.11.4): "default" (LeCun normal, fan-in),
  "relu" (He normal), "glorot", "gating" (weights 0, bias 1) and "final" (all zeros, so every
  residual branch starts as the identity).
- `Attention`: gated multi-head attention with optional pair bias (Alg. 7 / 8 / 13 / 14 share it),
  evaluated in chunks over the "row" dimension when `chunk_size` is set (§1.11.8); the softmax
  itself is `protdp.model.attention.biased_attention` with the module's `backend`.
- `Transition`: 2-layer MLP (Alg. 9 / 15), also chunked; unmasked, as in AF2.
- `SharedDropout`: dropout whose mask is shared along rows or columns (§1.11.6).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from protdp.model.attention import (MASK_NEG, TRANSIENT_ELEMENTS, biased_attention,
                                     resolved_backend)
from protdp.model.precision import active_autocast_dtype

INIT_SCHEMES = ("default", "relu", "glorot", "gating", "final")


def _trunc_normal_(weight: torch.Tensor, scale: float) -> None:
    """Truncated normal with std = sqrt(scale / fan_in), corrected for truncation at 2 sigma."""
    fan_in = weight.shape[1]
    std = math.sqrt(scale / max(1, fan_in)) / 0.87962566103423978
    with torch.no_grad():
        nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)


class Linear(nn.Linear):
    """nn.Linear with AF2 initialisation schemes."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, init: str = "default"):
        if init not in INIT_SCHEMES:
            raise ValueError(f"unknown init {init!r}; expected one of {INIT_SCHEMES}")
        self.init_scheme = init
        super().__init__(in_dim, out_dim, bias=bias)

    def reset_parameters(self) -> None:
        init = getattr(self, "init_scheme", "default")
        if init == "default":
            _trunc_normal_(self.weight, 1.0)
        elif init == "relu":
            _trunc_normal_(self.weight, 2.0)
        elif init == "glorot":
            nn.init.xavier_uniform_(self.weight)
        else:  # gating / final
            nn.init.zeros_(self.weight)
        if self.bias is not None:
            nn.init.constant_(self.bias, 1.0 if init == "gating" else 0.0)


LayerNorm = nn.LayerNorm


class _LayerNormLinear(torch.autograd.Function):
    """[LayerNorm(x) W_i^T + b_i for each i] keeping x (and no LayerNorm(x)) for backward, where
    the normalised input is recomputed: one [*, C] activation less per LayerNorm -> Linear site.
    Every output has its own storage (a saved slice of a concatenated output would keep all of
    it alive). Outputs flagged in `channels_first` come out as [*, c, A, B] for x [*, A, B, C]
    (the GEMM writes that layout: no transposed copy for the triangle products or a bias that
    is read per channel). Under autocast it computes what the modules do there: LayerNorm in
    fp32 (AF2 / OpenFold), the projections in the autocast dtype (`protdp.model.precision`)."""

    @staticmethod
    def forward(ctx, x, gamma, beta, eps, channels_first, *weights_and_biases):
        device = x.device.type
        ctx.compute_dtype = active_autocast_dtype(device)
        ctx.eps, ctx.channels_first = eps, channels_first
        n = len(weights_and_biases) // 2
        weights, biases = weights_and_biases[:n], weights_and_biases[n:]
        with torch.autocast(device, enabled=False):
            x_n, mean, rstd = _layer_norm(ctx, x, gamma, beta)
            ctx.save_for_backward(x, gamma, beta, mean, rstd, *weights)
            x_t = _pairs_channels_first(x_n) if any(channels_first) else None   # [B, C, A*B']
            outs = []
            for w, b, cf in zip(weights, biases, channels_first):
                w, b = w.to(x_n.dtype), b.to(x_n.dtype)
                if cf:   # [B, c, A*B'] = b + W [C, A*B'] per batch, viewed [*, c, A, B']
                    y = torch.baddbmm(b[:, None], w.expand(x_t.shape[0], *w.shape), x_t)
                    outs.append(y.view(x.shape[:-3] + (w.shape[0],) + x.shape[-3:-1]))
                else:
                    outs.append(F.linear(x_n, w, b))
            return tuple(outs)

    @staticmethod
    def backward(ctx, *d_ys):
        x, gamma, beta, mean, rstd, *weights = ctx.saved_tensors
        with torch.autocast(x.device.type, enabled=False):
            x_n = _layer_norm(ctx, x, gamma, beta)[0]                    # same values
            x_n2 = x_n.reshape(-1, x.shape[-1])                          # [N, C]
            x_t = _pairs_channels_first(x_n) if any(ctx.channels_first) else None
            norm_dtype = mean.dtype
            d_weights, d_biases, d_x_n = [], [], None
            for w, d_y, cf in zip(weights, d_ys, ctx.channels_first):
                if d_y is None:
                    d_y = x_n.new_zeros(x.shape[:-1] + (w.shape[0],))
                    cf = False
                w_c = w.to(x_n.dtype)
                if cf:
                    d_y3 = d_y.to(x_n.dtype).reshape(x_t.shape[0], w.shape[0], -1)  # [B, c, N']
                    d_weights.append(torch.bmm(d_y3, x_t.transpose(1, 2)).sum(0).to(w.dtype))
                    d_biases.append(d_y3.sum((0, 2), dtype=norm_dtype).to(w.dtype))
                    w_b = w_c.expand(d_y3.shape[0], *w.shape)                  # [B, c, C]
                    if d_x_n is not None and d_x_n.dtype == d_y3.dtype:
                        d_x_n.view(d_y3.shape[0], -1, x.shape[-1]).baddbmm_(d_y3.transpose(1, 2), w_b)
                        continue
                    d_part = torch.bmm(d_y3.transpose(1, 2), w_b).reshape(-1, x.shape[-1])  # [N, C]
                else:
                    d_y2 = d_y.to(x_n.dtype).reshape(-1, w.shape[0])
                    d_weights.append(d_y2.t().mm(x_n2).to(w.dtype))
                    d_biases.append(d_y2.sum(0, dtype=norm_dtype).to(w.dtype))
                    if d_x_n is not None and d_x_n.dtype == d_y2.dtype:
                        d_x_n.addmm_(d_y2, w_c)        # accumulated in the GEMM: no extra pass
                        continue
                    d_part = d_y2.mm(w_c)
                d_x_n = d_part.to(norm_dtype) if d_x_n is None else d_x_n.add_(d_part)
            del x_n, x_n2, x_t
            d_x, d_gamma, d_beta = torch.ops.aten.native_layer_norm_backward(
                d_x_n.view(x.shape), x.to(norm_dtype), (x.shape[-1],), mean, rstd,
                gamma.to(norm_dtype), beta.to(norm_dtype), list(ctx.needs_input_grad[:3]))
        return (None if d_x is None else d_x.to(x.dtype),
                None if d_gamma is None else d_gamma.to(gamma.dtype),
                None if d_beta is None else d_beta.to(beta.dtype), None, None,
                *d_weights, *d_biases)


def _pairs_channels_first(x_n: torch.Tensor) -> torch.Tensor:
    """x_n [*, A, B, C] -> a [B*, C, A*B] transposed view (no copy) for channels-first GEMMs."""
    return x_n.reshape((-1, x_n.shape[-3] * x_n.shape[-2], x_n.shape[-1])).transpose(1, 2)


def _layer_norm(ctx, x, gamma, beta):
    """(LayerNorm(x) in the projections' dtype, mean, rstd): statistics in x's dtype, or in fp32
    under autocast (as autocast runs layer_norm)."""
    norm_dtype = x.dtype if ctx.compute_dtype is None else torch.float32
    x_n, mean, rstd = torch.native_layer_norm(x.to(norm_dtype), (x.shape[-1],),
                                              gamma.to(norm_dtype), beta.to(norm_dtype), ctx.eps)
    return (x_n if ctx.compute_dtype is None else x_n.to(ctx.compute_dtype)), mean, rstd


def fused_projection_enabled() -> bool:
    """Training: LayerNorm -> projections run as one `_LayerNormLinear` (with or without
    autocast); without autograd the modules run one by one."""
    return torch.is_grad_enabled()


def norm_project(norm: nn.LayerNorm, linears, x: torch.Tensor,
                 channels_first=None) -> list[torch.Tensor]:
    """[linear(norm(x)) for linear in linears], with one LayerNorm whose output is recomputed in
    backward instead of stored (`_LayerNormLinear`) in training; the module calls otherwise.
    Same values. `channels_first[i]`: output i as [*, c, A, B] for x [*, A, B, C] (a view of
    the channels-last result on the module path)."""
    channels_first = tuple(bool(f) for f in (channels_first or [False] * len(linears)))
    if not fused_projection_enabled():
        x_n = norm(x)
        return [lin(x_n).movedim(-1, -3) if cf else lin(x_n)
                for lin, cf in zip(linears, channels_first)]
    biases = [lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features)
              for lin in linears]
    return list(_LayerNormLinear.apply(x, norm.weight, norm.bias, norm.eps, channels_first,
                                       *(lin.weight for lin in linears), *biases))


def transient_rows(row_elements: int) -> int:
    """Rows of `row_elements` each that make one transient block (TRANSIENT_ELEMENTS; at least
    one row): CPU training works through a transition's [*, R, Q, n*C] hidden layer this many
    rows at a time, each block under glibc's mmap threshold (heap-reused, not page-faulted in
    again), with the same saved tensors in total."""
    return max(1, TRANSIENT_ELEMENTS // row_elements)


def chunk_rows(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
               mask: torch.Tensor, chunk_size: int | None) -> torch.Tensor:
    """Evaluate fn(x_rows, mask_rows) on slices of `chunk_size` rows (dim -3 of x, dim -2 of
    mask) and concatenate; rows are independent, so the result equals fn(x, mask)."""
    size = x.shape[-3]
    if chunk_size is None or chunk_size >= size:
        return fn(x, mask)
    outs = []
    for start in range(0, size, chunk_size):
        n = min(chunk_size, size - start)
        m = mask if mask.shape[-2] == 1 else mask.narrow(-2, start, n)
        outs.append(fn(x.narrow(-3, start, n), m))
    return torch.cat(outs, dim=-3)


class Attention(nn.Module):
    """Gated multi-head self-attention over the query axis of x [*, R, Q, C_in].

    The rows R are independent attention problems ("batch"); `bias` [*, H, Q, Q] is shared by
    all rows (pair bias / triangle bias) and `mask` [*, R, Q] masks keys.
    """

    def __init__(self, c_in: int, c_hidden: int, n_heads: int, backend: str = "auto"):
        super().__init__()
        self.c_hidden = c_hidden
        self.n_heads = n_heads
        resolved_backend(backend, "cpu")                  # validates the name
        self.backend = backend
        hc = c_hidden * n_heads
        self.linear_q = Linear(c_in, hc, bias=False, init="glorot")
        self.linear_k = Linear(c_in, hc, bias=False, init="glorot")
        self.linear_v = Linear(c_in, hc, bias=False, init="glorot")
        self.linear_g = Linear(c_in, hc, init="gating")
        self.linear_o = Linear(hc, c_in, init="final")

    @property
    def projections(self) -> list[nn.Linear]:
        return [self.linear_q, self.linear_k, self.linear_v, self.linear_g]

    def _attend(self, x: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.core(*(lin(x) for lin in self.projections), mask, bias)

    def core(self, q, k, v, g, mask, bias):
        """q, k, v, g [*, R, Q, H*c] (projections), mask [*, R, Q], bias [*, H, Q, Q] -> [*, R, Q, C]."""
        h = self.n_heads
        q = rearrange(q, "... q (h c) -> ... h q c", h=h)                          # [*, R, H, Q, c]
        k = rearrange(k, "... k (h c) -> ... h k c", h=h)
        v = rearrange(v, "... k (h c) -> ... h k c", h=h)
        bias = None if bias is None else bias.unsqueeze(-4)                      # [*, 1, H, Q, K]
        o = biased_attention(q, k, v, mask, bias, self.backend)                  # [*, R, H, Q, c]
        o = rearrange(o, "... h q c -> ... q (h c)")                              # [*, R, Q, H*c]
        return self.linear_o(o * torch.sigmoid(g))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor | None = None,
                chunk_size: int | None = None) -> torch.Tensor:
        # x [*, R, Q, C], mask [*, R, Q], bias [*, H, Q, Q] -> [*, R, Q, C]
        return chunk_rows(lambda xc, mc: self._attend(xc, mc, bias), x, mask, chunk_size)


def set_attention_backend(module: nn.Module, backend: str) -> None:
    """Use `backend` (protdp.model.attention.BACKENDS) in every Attention inside `module`."""
    resolved_backend(backend, "cpu")
    for sub in module.modules():
        if isinstance(sub, Attention):
            sub.backend = backend


def set_inference_chunk_size(module: nn.Module, chunk_size: int | None) -> None:
    """Set `inference_chunk_size` on every submodule that has one (triangle multiplication:
    it chunks only without autograd), from ModelConfig.chunk_size."""
    for sub in module.modules():
        if hasattr(sub, "inference_chunk_size"):
            sub.inference_chunk_size = chunk_size


class Transition(nn.Module):
    """LayerNorm -> Linear(relu) n*c -> Linear(final) c (Alg. 9 and 15), chunked over rows."""

    def __init__(self, c: int, n: int):
        super().__init__()
        self.norm = LayerNorm(c)
        self.linear_1 = Linear(c, n * c, init="relu")
        self.linear_2 = Linear(n * c, c, init="final")

    def _transition(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # no masking, as in AF2's Transition: a padded row's value is never read by a real one
        hidden, = norm_project(self.norm, [self.linear_1], x)                  # [*, R, Q, n*C]
        hidden = hidden.relu_() if not torch.is_grad_enabled() else F.relu(hidden)
        return self.linear_2(hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        # x [*, R, Q, C], mask [*, R, Q] (only sets the chunk layout) -> [*, R, Q, C]
        if chunk_size is None and torch.is_grad_enabled() and x.device.type == "cpu":
            chunk_size = transient_rows(x.shape[-2] * self.linear_1.out_features)
        return chunk_rows(self._transition, x, mask, chunk_size)


class SharedDropout(nn.Module):
    """Dropout with the mask shared along one axis of [*, R, Q, C] (§1.11.6).

    `shared_dim=-3` shares the mask across rows ("row-wise" dropout in AF2: one mask per
    column position broadcast over all rows); `shared_dim=-2` shares it across columns.
    """

    def __init__(self, p: float, shared_dim: int):
        super().__init__()
        self.p = p
        self.shared_dim = shared_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        shape = list(x.shape)
        shape[self.shared_dim] = 1
        keep = torch.bernoulli(torch.full(shape, 1.0 - self.p, device=x.device, dtype=x.dtype))
        return x * keep / (1.0 - self.p)
