"""The memory-saving training path under bf16 autocast (issue 29 D2): LayerNorm -> projections
(`_LayerNormLinear`), the gated triangle product, the outer product and "recompute" attention run
under autocast with LayerNorm in fp32 and projections in bf16, as the unfused modules do there,
and store less than the unfused path."""

import pytest
import torch

from model_fixtures import tiny_config, one_thread  # noqa: F401
from protdp.model import evoformer, primitives
from protdp.model.evoformer import EvoformerBlock
from protdp.model.primitives import LayerNorm, Linear, norm_project, set_attention_backend


def _randomize(module, scale=0.2, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def _unfused(monkeypatch):
    for module in (evoformer, primitives):
        monkeypatch.setattr(module, "fused_projection_enabled", lambda: False)


def _max_rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def test_layernorm_linear_under_autocast_equals_the_modules(monkeypatch):
    """Forward bitwise equal to LayerNorm (fp32) -> Linear (bf16) under CPU autocast; gradients
    of x, gamma, beta, weights and biases within bf16 rounding of the module path's."""
    torch.manual_seed(0)
    norm, lins = LayerNorm(24), [Linear(24, 16), Linear(24, 8, bias=False)]
    _randomize(torch.nn.ModuleList([norm, *lins]), scale=0.5)
    params = [norm.weight, norm.bias] + [p for lin in lins for p in lin.parameters()]
    x0 = torch.randn(3, 7, 24)

    def run():
        for p in params:
            p.grad = None
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = norm_project(norm, lins, x)
            loss = sum((o.float() * torch.linspace(-1, 1, o.shape[-1])).sin().sum() for o in outs)
        loss.backward()
        return outs, [x.grad] + [p.grad.clone() for p in params]

    fused_outs, fused_grads = run()
    _unfused(monkeypatch)
    ref_outs, ref_grads = run()
    for a, b in zip(fused_outs, ref_outs):
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b)
    for a, b in zip(fused_grads, ref_grads):
        assert a.dtype == b.dtype and _max_rel(a, b) < 1e-2


def _saved_bytes(fn):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total[0], out


@pytest.mark.parametrize("backend", ["explicit", "recompute"])
def test_block_under_autocast_fused_equals_unfused_and_stores_less(monkeypatch, backend):
    """A whole Evoformer block under bf16 autocast: outputs and every gradient of the fused
    path as close to fp32 as the unfused modules' under autocast are, and fewer bytes saved for
    backward."""
    torch.manual_seed(0)
    cfg = tiny_config()
    block = EvoformerBlock(cfg, cfg.c_m, cfg.c_hidden_msa_att)
    set_attention_backend(block, backend)
    _randomize(block, scale=0.2, seed=4)
    block.eval()
    m0, z0 = torch.randn(2, 5, 9, cfg.c_m), torch.randn(2, 9, 9, cfg.c_z)
    msa_mask, pair_mask = (torch.rand(2, 5, 9) > 0.2).float(), (torch.rand(2, 9, 9) > 0.2).float()

    def run(bf16=True):
        block.zero_grad()
        m, z = m0.clone().requires_grad_(), z0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            saved, (mo, zo) = _saved_bytes(lambda: block(m, z, msa_mask, pair_mask))
        (mo.float().sin().sum() + zo.float().cos().sum()).backward()
        return saved, [mo, zo, m.grad, z.grad] + [p.grad.clone() for p in block.parameters()]

    _, ref = run(bf16=False)                                      # fp32
    fused_saved, fused = run()
    _unfused(monkeypatch)
    plain_saved, plain = run()
    assert fused_saved < 0.85 * plain_saved, (fused_saved, plain_saved)
    names = ["m", "z", "d_m", "d_z"] + [n for n, _ in block.named_parameters()]
    for name, a, b, r in zip(names, fused, plain, ref):
        assert torch.isfinite(a).all(), name
        assert a.dtype == b.dtype, name
        # bf16 rounding (8 mantissa bits) through the block: the fused path deviates from fp32
        # no more than the unfused modules do (gradients that cancel deviate more in both)
        assert _max_rel(a, r) <= 2 * _max_rel(b, r) + 1e-2, (name, _max_rel(a, r), _max_rel(b, r))


@pytest.mark.parametrize("autocast", [False, True])
def test_channels_first_projections_equal_the_modules(monkeypatch, autocast):
    """`norm_project(..., channels_first)`: outputs [*, c, A, B] written by the GEMM equal the
    modules' channels-last outputs moved (fp64: to rounding; bf16 autocast: bitwise forward,
    gradients within bf16 rounding), with batch dims and a channels-last output mixed in."""
    torch.manual_seed(0)
    dtype = torch.float32 if autocast else torch.float64
    norm, lins = LayerNorm(12), [Linear(12, 5), Linear(12, 3, bias=False), Linear(12, 4)]
    _randomize(torch.nn.ModuleList([norm, *lins]), scale=0.5)
    norm, lins = norm.to(dtype), [lin.to(dtype) for lin in lins]
    params = [norm.weight, norm.bias] + [p for lin in lins for p in lin.parameters()]
    x0 = torch.randn(2, 6, 7, 12, dtype=dtype)
    up = [torch.randn(2, 5, 6, 7), torch.randn(2, 3, 6, 7), torch.randn(2, 6, 7, 4)]

    def run():
        for p in params:
            p.grad = None
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            outs = norm_project(norm, lins, x, channels_first=[True, True, False])
        sum((o.float() * u).sum() for o, u in zip(outs, up)).backward()
        return outs, [x.grad] + [p.grad.clone() for p in params]

    outs, grads = run()
    assert [tuple(o.shape) for o in outs] == [(2, 5, 6, 7), (2, 3, 6, 7), (2, 6, 7, 4)]
    _unfused(monkeypatch)
    ref_outs, ref_grads = run()
    for a, b in zip(outs + grads, ref_outs + ref_grads):
        assert a.dtype == b.dtype
        assert _max_rel(a, b) < (1e-2 if autocast else 1e-13), _max_rel(a, b)
    if autocast:
        assert all(torch.equal(a, b) for a, b in zip(outs, ref_outs))
