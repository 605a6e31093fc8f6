"""Biased attention backends (issue 29 D1): every backend equals the explicit path — outputs and
the gradients of q, k, v, the pair bias and the module weights — in fp64 (to rounding) and fp32
(within fp32 tolerance), at OpenFold's test shapes and awkward lengths (1, 17, 64 mod 128),
with partly and fully masked rows."""

import pytest
import torch

from model_fixtures import one_thread  # noqa: F401

from protdp.model.attention import _flash_rows as flash_rows
from protdp.model.attention import (BACKENDS, backend_report, biased_attention,
                                    explicit_attention, lowmem_attention, recompute_attention,
                                    resolved_backend, sdpa_attention)
from protdp.model.config import ModelConfig
from protdp.model.primitives import Attention, set_attention_backend

TOL = {torch.float64: 1e-12, torch.float32: 2e-5}


def _inputs(dtype, rows, heads, n, c, masked_rows=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, rows, heads, n, c, generator=g, dtype=dtype).requires_grad_()
               for _ in range(3))
    bias = torch.randn(1, 1, heads, n, n, generator=g, dtype=dtype).requires_grad_()  # shared by rows
    mask = (torch.rand(1, rows, n, generator=g) > 0.25).to(dtype)
    mask[..., 0] = 1                                     # every row keeps a key ...
    for r in masked_rows:                                # ... except the fully masked ones
        mask[:, r] = 0
    up = torch.randn(1, rows, heads, n, c, generator=g, dtype=dtype)
    for r in masked_rows:                                # padding rows get no upstream gradient
        up[:, r] = 0
    return q, k, v, bias, mask, up


def _out_and_grads(fn, q, k, v, bias, mask, up):
    out = fn(q, k, v, mask, bias)
    return (out,) + torch.autograd.grad(out, (q, k, v, bias), up)


def _max_rel(a, b):
    """Max |a - b| relative to max |b|; absolute where b is exactly zero (one key: dq = dk = 0,
    which the fused paths reach to rounding, e.g. exp(logit - logsumexp) = 1 - 1e-16)."""
    scale = b.abs().max()
    return ((a - b).abs().max() / (scale if scale > 0 else 1.0)).item()


# (rows, heads, length, channels): OpenFold's Evoformer-attention kernel test shape (18 MSA rows,
# 20 residues, 4 heads, 32 channels), lengths 1, 17, 64 and 192 (64 mod 128: the H100 cuDNN
# bias-gradient bug), 8 heads
SHAPES = [(18, 4, 20, 32), (3, 4, 1, 8), (5, 4, 17, 16), (2, 2, 64, 32), (2, 2, 192, 8), (3, 8, 25, 32)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_sdpa_equals_explicit_outputs_and_grads(dtype, shape):
    rows, heads, n, c = shape
    masked = (rows - 1,) if n > 1 else ()
    args = _inputs(dtype, rows, heads, n, c, masked_rows=masked)
    ref = _out_and_grads(explicit_attention, *args)
    got = _out_and_grads(lambda *a: sdpa_attention(*a, kernel="sdpa_math"), *args)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), got, ref):
        assert torch.isfinite(a).all(), name
        assert _max_rel(a, b) < TOL[dtype], (name, _max_rel(a, b))
    # "recompute": the explicit values, even the zero bias gradient of fully masked rows
    # under any upstream gradient; row chunks of 1 (the default would take all rows at once)
    args = args[:5] + (torch.randn_like(args[5]),)
    ref = _out_and_grads(explicit_attention, *args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("protdp.model.attention.RECOMPUTE_ELEMENTS", 1)
        got = _out_and_grads(recompute_attention, *args)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), got, ref):
        assert _max_rel(a, b) < TOL[dtype], ("recompute", name, _max_rel(a, b))


def test_recompute_bias_gradient_without_batch_axis():
    """q [R, H, Q, c] with a bias [1, H, Q, K] (m under DAP has no batch axis, so the rows sit in
    the leading axis the bias is broadcast over): the bias gradient sums over every broadcast
    axis, as explicit's does (it raised a shape error on one rank, and its DAP peer hung)."""
    q, k, v, bias, mask, up = (t[0] for t in _inputs(torch.float64, 6, 2, 9, 4))
    bias = bias.detach().requires_grad_()                           # [1, H, Q, K]
    ref = _out_and_grads(explicit_attention, q, k, v, bias, mask, up)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("protdp.model.attention.RECOMPUTE_ELEMENTS", 2 * 9 * 9)   # 1 row per chunk
        got = _out_and_grads(recompute_attention, q, k, v, bias, mask, up)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), got, ref):
        assert a.shape == b.shape and _max_rel(a, b) < 1e-12, (name, _max_rel(a, b))


@pytest.mark.parametrize("rows_per_chunk", [1, 2, 6])
def test_recompute_chunks_with_and_without_masked_keys(rows_per_chunk):
    """"recompute" skips the key mask in row chunks that mask no key (forward and backward) and
    runs the CPU flash kernel forward where no row is fully masked:
    fp64 outputs and gradients equal explicit's with unmasked, partly and fully masked rows
    mixed across chunks, under an upstream gradient on every row."""
    q, k, v, bias, mask, _ = _inputs(torch.float64, 6, 2, 9, 4, masked_rows=(4,), seed=3)
    mask[:, :2] = 1                                      # rows 0-1 mask no key; 2-3, 5 partly
    up = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    ref = _out_and_grads(explicit_attention, q, k, v, bias, mask, up)
    fused = []

    def spy(*args):
        fused.append(flash_rows(*args))
        return fused[-1]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("protdp.model.attention.RECOMPUTE_ELEMENTS", rows_per_chunk * 2 * 9 * 9)
        mp.setattr("protdp.model.attention._flash_rows", spy)
        got = _out_and_grads(recompute_attention, q, k, v, bias, mask, up)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), got, ref):
        assert _max_rel(a, b) < 1e-12, (name, _max_rel(a, b))
    # the fused CPU forward (weights rebuilt from its logsumexp) ran on every chunk without a
    # fully masked row; the chunk holding row 4 took the softmax path
    assert sum(f is not None for f in fused) == {1: 5, 2: 2, 6: 0}[rows_per_chunk]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_cpu_and_lowmem_inference_equal_explicit(dtype, shape):
    """The CPU flash kernel (no bias gradient) and the blocked online softmax, without a graph."""
    rows, heads, n, c = shape
    q, k, v, bias, mask, _ = _inputs(dtype, rows, heads, n, c, masked_rows=(0,) if n > 1 else ())
    with torch.no_grad():
        ref = explicit_attention(q, k, v, mask, bias)
        for out in (sdpa_attention(q, k, v, mask, bias, kernel="sdpa_flash_cpu"),
                    lowmem_attention(q, k, v, mask, bias, q_block=7, k_block=5)):
            assert torch.isfinite(out).all()
            assert _max_rel(out, ref) < TOL[dtype]
        # without a bias: the broadcast [*, 1, 1, K] mask path
        ref_nb = explicit_attention(q, k, v, mask, None)
        out_nb = sdpa_attention(q, k, v, mask, None, kernel="sdpa_flash_cpu")
        assert _max_rel(out_nb, ref_nb) < TOL[dtype]
        # one block (the defaults) equals many blocks (above)
        assert _max_rel(lowmem_attention(q, k, v, mask, bias), ref) < TOL[dtype]


def test_masked_keys_have_no_influence_in_every_backend():
    q, k, v, bias, mask, _ = _inputs(torch.float64, 3, 2, 17, 8)
    v2, bias2 = v.detach().clone(), bias.detach().clone()
    v2[mask[:, :, None, :].expand_as(v2[..., 0]) == 0] = 1e3            # values of masked keys
    with torch.no_grad():
        for backend in ("explicit", "sdpa", "lowmem"):
            a = biased_attention(q, k, v, mask, bias, backend)
            b = biased_attention(q, k, v2, mask, bias2, backend)
            assert torch.allclose(a, b, atol=1e-9), backend


@pytest.mark.parametrize("backend", ["sdpa", "lowmem", "auto", "recompute"])
def test_attention_module_weights_grads_equal_explicit(backend):
    """Through the gated Attention module (Alg. 7 with pair bias): outputs, the input and bias
    gradients and every weight gradient equal the explicit backend's (fp64), chunked or not;
    "lowmem" falls back to a differentiable kernel when a graph is built."""
    torch.manual_seed(0)
    att = Attention(c_in=12, c_hidden=8, n_heads=3).double()
    for p in att.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(1, 4, 17, 12, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, 3, 17, 17, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(1, 4, 17) > 0.3).double()
    mask[..., 0] = 1
    up = torch.randn(1, 4, 17, 12, dtype=torch.float64)

    def run(name, chunk):
        set_attention_backend(att, name)
        att.zero_grad()
        out = att(x, mask, bias, chunk_size=chunk)
        gx, gb = torch.autograd.grad(out, (x, bias), up, retain_graph=True)
        out.backward(up)
        return [out, gx, gb] + [p.grad.clone() for p in att.parameters()]

    ref = run("explicit", None)
    for chunk in (None, 3):
        for a, b in zip(run(backend, chunk), ref):
            assert _max_rel(a, b) < 1e-12


def test_backend_resolution_and_report():
    assert resolved_backend("auto", "cuda", bias_grad=True) == "sdpa_efficient"   # never cuDNN
    assert resolved_backend("sdpa", "cuda") == "sdpa_efficient"
    assert resolved_backend("auto", "cpu", bias_grad=True) == "recompute"
    assert resolved_backend("auto", "cpu", bias_grad=False) == "sdpa_flash_cpu"
    assert resolved_backend("sdpa", "cpu", bias_grad=True) == "sdpa_math"
    assert resolved_backend("lowmem", "cuda") == "lowmem"
    assert backend_report("auto", "cpu") == {"attention_backend": "auto",
                                             "attention_kernel_train": "recompute",
                                             "attention_kernel_infer": "sdpa_flash_cpu"}
    assert set(BACKENDS) == {"auto", "explicit", "sdpa", "lowmem", "recompute"}
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        resolved_backend("cudnn", "cpu")
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        ModelConfig(attention_backend="flash")


@pytest.mark.parametrize("outgoing", [True, False])
def test_triangle_multiplication_inference_path_equals_autograd_path(outgoing):
    """D2: the no-grad path (in-place gates, output rows in chunks) gives the autograd path's
    values, for outgoing and incoming edges, with padding, chunked or not."""
    from protdp.model.evoformer import TriangleMultiplication
    from protdp.model.primitives import set_inference_chunk_size

    torch.manual_seed(0)
    tri = TriangleMultiplication(c_z=6, c_hidden=5, outgoing=outgoing).double()
    for p in tri.parameters():
        torch.nn.init.normal_(p, std=0.5)
    z = torch.randn(2, 11, 11, 6, dtype=torch.float64)
    mask = torch.ones(2, 11, 11, dtype=torch.float64)
    mask[1, 8:, :] = 0
    mask[1, :, 8:] = 0
    ref = tri(z, mask)                                   # autograd path (grad enabled)
    assert ref.requires_grad
    for chunk in (None, 1, 4, 11, 50):
        set_inference_chunk_size(tri, chunk)
        with torch.no_grad():
            got = tri(z, mask)
        assert _max_rel(got, ref.detach()) < 1e-13, chunk
