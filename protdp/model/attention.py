"""Biased multi-head attention with chosen backends (the core of AF2 Alg. 7, 8, 13, 14).

    out[*, H, Q, c] = softmax(q k^T / sqrt(c) + bias + mask) v

with q, k, v [*, H, Q|K, c], a key `mask` [*, K] (1 keep, 0 drop; one mask per attention
problem, e.g. per MSA row) and an optional `bias` [*', H, Q, K] that is broadcast over the
leading dims (the pair / triangle bias is shared by all rows, so its gradient is a sum over
rows). Backends:

- "explicit": logits and softmax materialised in fp32, masked keys replaced by MASK_NEG
  (`masked_fill`). The reference every other backend is tested against.
- "sdpa": `torch.nn.functional.scaled_dot_product_attention` pinned per device, so the kernel
  that runs is known, not picked by PyTorch's heuristics: on CUDA the memory-efficient kernel
  (the only CUDA kernel that takes a float bias *and* returns its gradient; flash rejects float
  masks, cuDNN returns no bias gradient and has known bias bugs on Hopper, math materialises),
  on CPU the fused flash kernel. The key mask is folded into one extra q/k channel (q: 1,
  k: 0 or -big), so the mask never becomes a [*, H, Q, K] tensor; without a pair bias it is
  passed as a broadcast [*, 1, 1, K] additive mask instead.
- "recompute": the explicit values as one autograd function that keeps only q, k, v, bias,
  mask and the per-row logsumexp for backward and rebuilds the weights there as
  exp(logits - lse), `RECOMPUTE_ELEMENTS` logits at a time over rows; the bias gradient (a sum
  over rows) is accumulated chunk by chunk, so no [*, R, H, Q, K] tensor is ever stored (what
  the CUDA memory-efficient kernel does, on CPU). On CPU its forward is PyTorch's fused flash
  kernel (which returns the logsumexp), so the forward writes no logits either.
- "lowmem": inference-only (no autograd) query/key-blocked attention with an online softmax
  (Rabe & Staats 2021, as OpenFold's "low-memory attention"); peak extra memory
  [*, H, q_block, k_block] instead of [*, H, Q, K].

"auto" resolves to "sdpa" on CUDA, and on CPU to the fused kernel except for a bias that
needs a gradient (PyTorch's CPU flash kernel has none): there to "recompute", which stores no
[*, R, H, Q, K] weights (training peak memory against OpenFold's in
benchmarks/results/model_vs_openfold.json). The kernel actually used is reported by
`resolved_backend` / `backend_report`; metrics and provenance record it.

Fully masked query rows (padding): every backend gives uniform weights (the mean of v), as the
explicit path's masked_fill does; the fused paths reach it with a masked-key logit so large that
q.k + bias is absorbed in rounding. Their bias gradient from such a row is not zero (explicit's
is), but in AF2 padding rows receive no upstream gradient, so all backends give the same
gradients (tested with zero upstream gradient on those rows, as the model provides).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "explicit", "sdpa", "lowmem", "recompute")
"""Accepted values of ModelConfig.attention_backend."""

# Large negative value for masked attention logits (finite so fully-masked rows stay finite).
MASK_NEG = -1e9

# extra q/k channels that carry the key mask (one used, the rest zero): keeps the head dim a
# multiple of 8, which the CUDA memory-efficient kernel wants for aligned loads
MASK_CHANNELS = 8

# one transient working block of the training path (fp32 elements: 16 MiB): what the
# "recompute" backend's logits, the outer product mean's outer products and a transition's
# hidden layer are worked through at a time. Below glibc's largest dynamic mmap threshold
# (32 MiB), so on CPU a freed block is reused from the heap instead of being mapped and
# page-faulted in again on every allocation (benchmarks/results/model_vs_openfold.json)
TRANSIENT_ELEMENTS = 1 << 22
RECOMPUTE_ELEMENTS = TRANSIENT_ELEMENTS     # logits computed at a time by "recompute"

# default block sizes of the low-memory backend (queries x keys per step)
LOWMEM_Q_BLOCK = 256
LOWMEM_K_BLOCK = 1024


def resolved_backend(name: str, device: torch.device | str, bias_grad: bool = False) -> str:
    """The concrete kernel a backend name runs on `device`: "explicit", "recompute",
    "sdpa_efficient" (CUDA), "sdpa_flash_cpu" (CPU), "sdpa_math" or "lowmem". `bias_grad`: the
    bias needs a gradient. PyTorch's CPU flash kernel has no bias gradient (it refuses a bias
    that requires grad), so there "auto" is "recompute" and "sdpa" is the (materialising) math
    kernel."""
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    device_type = torch.device(device).type
    if name in ("explicit", "lowmem", "recompute"):
        return name
    if device_type == "cuda":
        return "sdpa_efficient"
    if device_type == "cpu":
        if not bias_grad:
            return "sdpa_flash_cpu"
        return "recompute" if name == "auto" else "sdpa_math"
    return "sdpa_math"


def backend_report(name: str, device: torch.device | str) -> dict:
    """What `name` runs on `device` for biased attention in training (bias needs a gradient) and
    in inference / unbiased attention: recorded in metrics and provenance."""
    return {"attention_backend": name,
            "attention_kernel_train": resolved_backend(name, device, bias_grad=True),
            "attention_kernel_infer": resolved_backend(name, device, bias_grad=False)}


def _sdpa_context(kernel: str):
    """Pin SDPA to one kernel (an error instead of a silent fallback if it cannot run)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    pinned = {"sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
              "sdpa_flash_cpu": SDPBackend.FLASH_ATTENTION,
              "sdpa_flash": SDPBackend.FLASH_ATTENTION,
              "sdpa_math": SDPBackend.MATH,
              "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[kernel]
    return sdpa_kernel([pinned])


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """Logits and softmax in fp32, or fp64 for fp64 inputs (never below fp32, as AF2/OpenFold)."""
    return torch.promote_types(dtype, torch.float32)


def explicit_attention(q, k, v, mask, bias=None):
    """Reference: q [*, H, Q, c], k/v [*, H, K, c], mask [*, K], bias [*', H, Q, K] -> [*, H, Q, c].
    Logits and softmax in fp32; in-place bias/mask updates (matmul/add/masked_fill backward never
    need these values, so only the logits and the softmax output are resident)."""
    acc = _softmax_dtype(q.dtype)
    logits = torch.matmul(q / math.sqrt(q.shape[-1]), k.transpose(-1, -2)).to(acc)  # [*, H, Q, K]
    if bias is not None:
        logits += bias.to(acc)
    logits.masked_fill_(mask[..., None, None, :] == 0, MASK_NEG)
    weights = torch.softmax(logits, dim=-1).to(v.dtype)
    return torch.matmul(weights, v)


def _mask_value(dtype: torch.dtype) -> float:
    """Additive logit of a masked key in the fused paths: so large (a 16th of the dtype's range)
    that q.k + bias is absorbed in rounding, so a fully masked row gets exactly uniform weights,
    as the explicit path's masked_fill gives; exp() of it is exactly 0 next to any real key."""
    return -torch.finfo(dtype).max / 16


def _flatten_lead(t: torch.Tensor, ndim_tail: int) -> torch.Tensor:
    return t.reshape((-1,) + t.shape[t.dim() - ndim_tail:])


def sdpa_attention(q, k, v, mask, bias=None, kernel: str = "sdpa_flash_cpu"):
    """Fused attention through SDPA pinned to `kernel`; same arguments as explicit_attention.
    The bias is cast to the query dtype (a float32 bias with bf16 q is never handed over)."""
    lead, (h, n_q, c), n_k = q.shape[:-3], q.shape[-3:], k.shape[-2]
    scale = 1.0 / math.sqrt(c)
    keep = (mask != 0)
    if bias is None:
        # [*, 1, 1, K] additive mask, broadcast by the kernel over heads and queries
        attn_mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device)
        attn_mask = attn_mask.masked_fill(~keep, _mask_value(q.dtype))[..., None, None, :]
        attn_mask = attn_mask.expand(lead + (1, 1, n_k))
    else:
        # key mask in an extra channel: q . k gains 1 * (0 | -big) per key, no [H, Q, K] mask;
        # the kernel's 1/sqrt(c) scaling leaves -big/sqrt(c), still far beyond any logit
        pad_q = q.new_zeros(lead + (h, n_q, MASK_CHANNELS))
        pad_q[..., 0] = 1.0
        pad_k = torch.zeros(lead + (h, n_k, MASK_CHANNELS), dtype=k.dtype, device=k.device)
        pad_k[..., 0] = (~keep).to(k.dtype)[..., None, :] * _mask_value(k.dtype)
        q = torch.cat([q, pad_q], dim=-1)
        k = torch.cat([k, pad_k], dim=-1)
        attn_mask = bias.to(q.dtype).expand(lead + (h, n_q, n_k))        # stride-0 over rows
        if not torch.is_grad_enabled():
            attn_mask = attn_mask.detach()   # a view of a leaf keeps requires_grad under no_grad
    if v.shape[-1] != q.shape[-1]:
        v_in = torch.cat([v, v.new_zeros(v.shape[:-1] + (q.shape[-1] - c,))], dim=-1)
    else:
        v_in = v
    qf, kf, vf = (_flatten_lead(t, 3) for t in (q, k, v_in))             # [B, H, Q, c']
    mf = _flatten_lead(attn_mask, 3)   # a view when the bias is shared (stride-0 rows) and B = 1
    with _sdpa_context(kernel):
        out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mf, scale=scale)
    return out[..., :c].reshape(lead + (h, n_q, c))


def _row_probs(q, k, bias, drop, acc):
    """Softmax weights (fp32/fp64) of a chunk of rows, masked keys replaced as in explicit
    (`drop` None: no key of the chunk is masked). q is scaled before the product: a pass over
    [*, H, Q, c] instead of one over the logits."""
    logits = torch.matmul(q.to(acc) * (1.0 / math.sqrt(q.shape[-1])), k.to(acc).transpose(-1, -2))
    if bias is not None:
        logits += bias.to(acc)
    if drop is not None:
        logits.masked_fill_(drop, MASK_NEG)
    return torch.softmax(logits, dim=-1)


def _flash_rows(q, k, v, bias, drop):
    """Forward of a chunk of rows through PyTorch's fused CPU flash kernel, which also returns
    the per-row logsumexp: (out [*, r, H, Q, c], lse [*, r, H, Q]), or None where it does not
    apply (not CPU; a bias that differs along a leading dim, which would be materialised).
    `drop` [*, r, 1, 1, K] or None (no masked key): the key mask rides in extra q/k channels
    as in sdpa_attention, the bias is passed stride-0 over the rows."""
    if q.device.type != "cpu":
        return None
    lead, (h, n_q, c), n_k = q.shape[:-3], q.shape[-3:], k.shape[-2]
    attn_mask = None
    if bias is not None:
        try:
            attn_mask = bias.to(q.dtype).expand(lead + (h, n_q, n_k)).view(-1, h, n_q, n_k)
        except RuntimeError:
            return None
    if drop is not None:
        pad_q = q.new_zeros(lead + (h, n_q, MASK_CHANNELS))
        pad_q[..., 0] = 1.0
        pad_k = k.new_zeros(lead + (h, n_k, MASK_CHANNELS))
        pad_k[..., 0] = drop[..., 0, :, :].to(k.dtype) * _mask_value(k.dtype)
        q, k = torch.cat([q, pad_q], dim=-1), torch.cat([k, pad_k], dim=-1)
        v = torch.cat([v, v.new_zeros(v.shape[:-1] + (MASK_CHANNELS,))], dim=-1)
    qf, kf, vf = (_flatten_lead(t, 3) for t in (q, k, v))                  # [B, H, Q|K, c']
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qf, kf, vf, 0.0, False, attn_mask=attn_mask, scale=1.0 / math.sqrt(c))
    return out[..., :c].reshape(lead + (h, n_q, c)), lse.reshape(lead + (h, n_q))


class _RecomputedAttention(torch.autograd.Function):
    """Explicit attention whose backward recomputes the weights row chunk by row chunk.
    q [*, R, H, Q, c], k/v [*, R, H, K, c], drop [*, R, 1, 1, K] (bool), bias [*, 1, H, Q, K].
    On CPU the forward is PyTorch's fused flash kernel (no [*, r, H, Q, K] logits written),
    which returns each row's logsumexp: backward rebuilds the weights as exp(logits - lse)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, drop, rows):
        with torch.autocast(q.device.type, enabled=False):   # dtypes explicit, as in explicit
            return _RecomputedAttention._forward(ctx, q, k, v, bias, drop, rows)

    @staticmethod
    def backward(ctx, d_out):
        with torch.autocast(d_out.device.type, enabled=False):
            return _RecomputedAttention._backward(ctx, d_out)

    @staticmethod
    def _forward(ctx, q, k, v, bias, drop, rows):
        acc = _softmax_dtype(q.dtype)
        # [*, R, H, Q, c] as a view of a [*, R, Q, H, c] buffer: the caller's [*, R, Q, H*c] is
        # then a view of it too, so the gate product keeps this storage (no copy of it)
        out = torch.empty(q.shape[:-3] + (q.shape[-2], q.shape[-3], v.shape[-1]), dtype=v.dtype,
                          device=v.device).transpose(-2, -3)
        lse = torch.empty(q.shape[:-1], dtype=acc, device=q.device)          # [*, R, H, Q]
        # per chunk: (masked, from_lse); masked 0: no masked key; 1: masked keys get weight
        # exactly 0 (exp underflows), so their gradient is 0 without masking; 2: a fully masked
        # query row (uniform weights: explicit's softmax path, masked_fill in backward)
        ctx.chunks = []
        for s in range(0, q.shape[-4], rows):
            sl = (..., slice(s, s + rows), slice(None), slice(None), slice(None))
            masked = int(drop[sl].any()) + int(drop[sl].all(-1).any())
            fused = _flash_rows(q[sl], k[sl], v[sl], bias, drop[sl] if masked else None) \
                if masked < 2 else None
            if fused is not None:
                out[sl], lse[sl[:-1]] = fused
            else:
                p = _row_probs(q[sl], k[sl], bias, drop[sl] if masked else None, acc)
                out[sl] = torch.matmul(p.to(v.dtype), v[sl])
            ctx.chunks.append((masked, fused is not None))
        # `out` is kept by the gating product after this function anyway (its [*, R, Q, H*c]
        # view: no extra memory); it gives the softmax backward's row term
        # rowsum(dP * P) = rowsum(dO * O) without a pass over the weights (FlashAttention-2's D)
        ctx.save_for_backward(q, k, v, bias, drop, lse, out)
        ctx.rows, ctx.has_bias = rows, bias is not None
        return out

    @staticmethod
    def _backward(ctx, d_out):
        q, k, v, bias, drop, lse, out = ctx.saved_tensors
        acc = _softmax_dtype(q.dtype)
        scale = 1.0 / math.sqrt(q.shape[-1])
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        d_bias = None if bias is None else torch.zeros(bias.shape, dtype=acc, device=bias.device)
        work = _ChunkWork()
        for s, (masked, from_lse) in zip(range(0, q.shape[-4], ctx.rows), ctx.chunks):
            sl = (..., slice(s, s + ctx.rows), slice(None), slice(None), slice(None))
            drop_c = drop[sl] if masked else None
            if from_lse:
                grads = work.from_lse(q[sl], k[sl], v[sl], bias, drop_c, lse[sl[:-1]], out[sl],
                                      d_out[sl], acc, scale)
                dq[sl], dk[sl], dv[sl] = grads[:3]
                if d_bias is not None:
                    d_bias += grads[3].sum_to_size(d_bias.shape)   # every broadcast axis
                continue
            p = _row_probs(q[sl], k[sl], bias, drop_c, acc)                 # [*, r, H, Q, K]
            g = d_out[sl].to(acc)
            dv[sl] = torch.matmul(p.transpose(-1, -2), g).to(dv.dtype)
            dp = torch.matmul(g, v[sl].to(acc).transpose(-1, -2))
            ds = torch.ops.aten._softmax_backward_data(dp, p, -1, acc)    # softmax backward
            if masked == 2:
                ds.masked_fill_(drop[sl], 0.0)                             # masked_fill backward
            if d_bias is not None:
                d_bias += ds.sum_to_size(d_bias.shape)   # every axis the bias is broadcast over
            dq[sl] = torch.matmul(ds, k[sl].to(acc)).mul_(scale).to(dq.dtype)
            dk[sl] = torch.matmul(ds.transpose(-1, -2), q[sl].to(acc)).mul_(scale).to(dk.dtype)
        return dq, dk, dv, (None if d_bias is None else d_bias.to(bias.dtype)), None, None


class _ChunkWork:
    """The backward of one row chunk whose weights come back from the logsumexp, on 3-D
    [r*H, Q|K, c] operands: the [r*H, Q, K] weights and their gradient are written into two
    buffers allocated once per backward and reused by every chunk (a fresh 16 MiB block per
    chunk would be page-faulted in again each time), the 1/sqrt(c) scale rides in the GEMMs
    (alpha), and the softmax backward's row term is rowsum(dO * O) from the saved output."""

    def __init__(self):
        self.p = self.dp = None

    def _buffers(self, n: int, n_q: int, n_k: int, dtype, device):
        if self.p is None or self.p.shape[0] < n or self.p.dtype != dtype:
            self.p = torch.empty((n, n_q, n_k), dtype=dtype, device=device)
            self.dp = torch.empty_like(self.p)
        return self.p[:n], self.dp[:n]

    def from_lse(self, q, k, v, bias, drop, lse, out, d_out, acc, scale):
        """(dq, dk, dv, dS [*, r, H, Q, K]) of a chunk q [*, r, H, Q, c], k/v [*, r, H, K, c]."""
        shape, (n_q, c), n_k = q.shape, q.shape[-2:], k.shape[-2]
        q3, k3, v3, g3 = (t.to(acc).reshape(-1, t.shape[-2], c)
                          for t in (q, k, v, d_out))                       # [r*H, Q|K, c]
        row = (d_out.to(acc) * out.to(acc)).sum(-1).reshape(-1, n_q, 1)    # [r*H, Q, 1]
        p, dp = self._buffers(q3.shape[0], n_q, n_k, acc, q.device)          # [r*H, Q, K]
        torch.baddbmm(p, q3, k3.transpose(1, 2), beta=0.0, alpha=scale, out=p)
        p4 = p.view(shape[:-2] + (n_q, n_k))                                 # [*, r, H, Q, K]
        if bias is not None:
            p4 += bias.to(acc)
        if drop is not None:    # an added [*, r, 1, 1, K] mask: a quarter of masked_fill's time
            p4 += torch.zeros(drop.shape, dtype=acc, device=q.device).masked_fill_(drop, MASK_NEG)
        p4.sub_(lse.to(acc)[..., None]).exp_()       # the weights (masked keys: exactly 0)
        torch.bmm(g3, v3.transpose(1, 2), out=dp)                            # dP = dO v^T
        dp.sub_(row).mul_(p)                                                 # dS, in place
        dq = torch.bmm(dp, k3).mul_(scale).view(shape)
        dk = torch.bmm(dp.transpose(1, 2), q3).mul_(scale).view(k.shape)
        dv = torch.bmm(p.transpose(1, 2), g3).view(v.shape)
        return dq, dk, dv, dp.view(p4.shape)


def recompute_attention(q, k, v, mask, bias=None):
    """Same arguments and values as explicit_attention; backward memory without the
    [*, R, H, Q, K] weights (see the module docstring)."""
    squeeze = q.dim() == 4                                    # [*, H, Q, c] without a row axis
    if squeeze:
        q, k, v = (t[..., None, :, :, :] for t in (q, k, v))
        mask = mask[..., None, :]
        bias = None if bias is None else bias[..., None, :, :, :]
    if bias is not None:
        bias = bias.reshape((1,) * (q.dim() - bias.dim()) + bias.shape)
        if bias.shape[-4] != 1:
            raise ValueError("recompute_attention: the bias must be shared by all rows ([*, 1, H, Q, K])")
    h, n_q, n_k = q.shape[-3], q.shape[-2], k.shape[-2]
    rows = max(1, RECOMPUTE_ELEMENTS // (h * n_q * n_k))
    drop = (mask == 0)[..., None, None, :]                                   # [*, R, 1, 1, K]
    out = _RecomputedAttention.apply(q, k, v, bias, drop, rows)
    return out[..., 0, :, :, :] if squeeze else out


@torch.no_grad()
def lowmem_attention(q, k, v, mask, bias=None, q_block: int = LOWMEM_Q_BLOCK,
                     k_block: int = LOWMEM_K_BLOCK):
    """Inference-only blocked attention with an online softmax (same arguments as
    explicit_attention); logits live one [*, H, q_block, k_block] block at a time, in fp32."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    acc_dtype = _softmax_dtype(q.dtype)
    q = q.to(acc_dtype) / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=v.dtype, device=v.device)
    drop = (mask == 0)[..., None, None, :]                                 # [*, 1, 1, K]
    for qs in range(0, n_q, q_block):
        qb = q[..., qs:qs + q_block, :]
        run_max = run_sum = acc = None
        for ks in range(0, n_k, k_block):
            logits = torch.matmul(qb, k[..., ks:ks + k_block, :].to(acc_dtype).transpose(-1, -2))
            if bias is not None:
                logits += bias[..., qs:qs + q_block, ks:ks + k_block].to(acc_dtype)
            logits.masked_fill_(drop[..., ks:ks + k_block], MASK_NEG)
            block_max = logits.amax(-1, keepdim=True)
            new_max = block_max if run_max is None else torch.maximum(run_max, block_max)
            p = torch.exp(logits - new_max)
            pv = torch.matmul(p, v[..., ks:ks + k_block, :].to(acc_dtype))
            if run_max is None:
                run_sum, acc = p.sum(-1, keepdim=True), pv
            else:
                correction = torch.exp(run_max - new_max)
                run_sum = run_sum * correction + p.sum(-1, keepdim=True)
                acc = acc * correction + pv
            run_max = new_max
        out[..., qs:qs + q_block, :] = (acc / run_sum).to(v.dtype)
    return out


def biased_attention(q, k, v, mask, bias=None, backend: str = "auto"):
    """Dispatch: q [*, H, Q, c], k/v [*, H, K, c], mask [*, K], bias [*', H, Q, K] broadcastable
    to [*, H, Q, K] -> [*, H, Q, c] in v's dtype. "lowmem" falls back to "sdpa" when a graph is
    being built (it has no backward)."""
    grad = torch.is_grad_enabled()
    bias_grad = grad and bias is not None and bias.requires_grad
    kernel = resolved_backend(backend, q.device, bias_grad)
    if kernel == "lowmem" and grad and any(t is not None and t.requires_grad for t in (q, k, v, bias)):
        kernel = resolved_backend("auto", q.device, bias_grad)
    if kernel == "explicit":
        return explicit_attention(q, k, v, mask, bias)
    if kernel == "lowmem":
        return lowmem_attention(q, k, v, mask, bias)
    if kernel == "recompute":
        return recompute_attention(q, k, v, mask, bias)
    dtype = q.dtype
    k, v = k.to(dtype), v.to(dtype)
    return sdpa_attention(q, k, v, mask, bias, kernel)


__all__ = ["BACKENDS", "MASK_NEG", "backend_report", "biased_attention", "explicit_attention",
           "lowmem_attention", "recompute_attention",
           "resolved_backend", "sdpa_attention"]
