"""Primitives: AF2 initialisers, chunked attention/transition equal unchunked, shared dropout."""

import pytest
import torch

from model_fixtures import one_thread  # noqa: F401

from protdp.model.primitives import Attention, Linear, SharedDropout, Transition, chunk_rows


def test_linear_init_schemes():
    torch.manual_seed(0)
    final = Linear(64, 32, init="final")
    assert final.weight.abs().sum() == 0 and final.bias.abs().sum() == 0
    gating = Linear(64, 32, init="gating")
    assert gating.weight.abs().sum() == 0 and torch.all(gating.bias == 1)
    default = Linear(400, 300, init="default")
    relu = Linear(400, 300, init="relu")
    # LeCun (1/fan_in) and He (2/fan_in) variance, truncated normals rescaled to the right std
    assert abs(default.weight.var().item() * 400 - 1.0) < 0.1
    assert abs(relu.weight.var().item() * 400 - 2.0) < 0.2
    assert default.weight.abs().max() <= 2.0 / 0.8796 * (1 / 400) ** 0.5 + 1e-6
    with pytest.raises(ValueError, match="unknown init"):
        Linear(2, 2, init="xavier")


def test_attention_chunked_matches_unchunked_with_bias_and_mask():
    torch.manual_seed(0)
    att = Attention(c_in=6, c_hidden=3, n_heads=2)
    torch.nn.init.normal_(att.linear_o.weight)          # make the output non-zero
    x = torch.randn(2, 7, 5, 6)                         # [B, R, Q, C]
    mask = (torch.rand(2, 7, 5) > 0.3).float()
    bias = torch.randn(2, 2, 5, 5)
    full = att(x, mask, bias)
    for chunk in (1, 3, 7, 100):
        assert torch.allclose(att(x, mask, bias, chunk_size=chunk), full, atol=1e-6)
    # masked keys have no influence on any query
    x2 = x.clone()
    x2[mask == 0] = 1e3
    out2 = att(x2, mask, bias)
    assert torch.allclose(out2[mask == 1], full[mask == 1], atol=1e-5)


def test_fully_masked_row_stays_finite():
    att = Attention(4, 2, 2)
    out = att(torch.randn(1, 3, 4), torch.zeros(1, 3), None)
    assert torch.isfinite(out).all()


def test_transition_chunked_and_unmasked():
    torch.manual_seed(0)
    tr = Transition(c=6, n=2)
    torch.nn.init.normal_(tr.linear_2.weight)
    x, mask = torch.randn(9, 4, 6), (torch.rand(9, 4) > 0.5).float()
    full = tr(x, mask)
    assert torch.allclose(tr(x, mask, chunk_size=2), full, atol=1e-6)
    # unmasked, as AF2's Transition: a padded row gets the same MLP output as any other
    ref = tr.linear_2(torch.relu(tr.linear_1(tr.norm(x))))
    assert torch.allclose(full, ref, atol=1e-6) and full[mask == 0].abs().sum() > 0


def test_chunk_rows_broadcast_mask():
    x = torch.randn(5, 3, 2)
    out = chunk_rows(lambda a, m: a * m[..., None], x, torch.ones(1, 3), chunk_size=2)
    assert torch.equal(out, x)


def test_shared_dropout_shares_mask_along_dim():
    torch.manual_seed(0)
    x = torch.ones(6, 10, 8)
    row = SharedDropout(0.5, shared_dim=-3).train()
    y = row(x)
    assert torch.all(y == y[:1])                        # same mask for every row
    assert set(y.unique().tolist()) <= {0.0, 2.0}
    col = SharedDropout(0.5, shared_dim=-2).train()
    y = col(x)
    assert torch.all(y == y[:, :1])
    assert torch.equal(SharedDropout(0.5, -3).eval()(x), x)


def test_model_moves_between_dtypes_and_devices():
    """nn.Module.to()/.float()/.double() must work (no module may shadow nn.Module._apply)."""
    from protdp.model import build_model

    model = build_model("configs/model/tiny.yaml", verbose=False).double()
    assert all(p.dtype == torch.float64 for p in model.parameters())
    model.to("cpu", torch.float32)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_norm_project_gradients_match_layernorm_then_linears():
    """The fused LayerNorm -> projections (normalised input recomputed in backward) against
    torch's gradcheck and the module path, with and without bias, fp64."""
    from protdp.model.primitives import LayerNorm, Linear, norm_project
    torch.manual_seed(0)
    norm = LayerNorm(6).double()
    lins = [Linear(6, 3).double(), Linear(6, 5, bias=False).double()]
    params = list(norm.parameters()) + [p for lin in lins for p in lin.parameters()]
    with torch.no_grad():
        for p in params:
            p.normal_()
    x = torch.randn(2, 4, 6, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: tuple(norm_project(norm, lins, t)), (x,))
    grads = []
    for fused in (True, False):
        ys = norm_project(norm, lins, x) if fused else [lin(norm(x)) for lin in lins]
        gs = torch.autograd.grad(ys[0].sin().sum() + ys[1].cos().sum(), [x] + params)
        grads.append(gs)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-13)
