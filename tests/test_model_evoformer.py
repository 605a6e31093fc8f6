"""Evoformer (Alg. 6-15): odd shapes, identity at init, mask/padding invariance, chunking,
recompute, triangle update definitions against explicit loops."""

import pytest
import torch

from model_fixtures import pad_batch, random_batch, tiny_config, one_thread  # noqa: F401
from protdp.model import build_model
from protdp.model.evoformer import EvoformerBlock, OuterProductMean, TriangleMultiplication


def _randomize(module: torch.nn.Module, scale: float = 0.3, seed: int = 0) -> None:
    """Replace all parameters (incl. zero-initialised final layers) with random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def test_block_is_identity_at_init_with_odd_shapes():
    cfg = tiny_config()
    block = EvoformerBlock(cfg, cfg.c_m, cfg.c_hidden_msa_att).eval()
    m, z = torch.randn(2, 13, 22, cfg.c_m), torch.randn(2, 22, 22, cfg.c_z)
    m2, z2 = block(m, z, torch.ones(2, 13, 22), torch.ones(2, 22, 22))
    assert m2.shape == (2, 13, 22, cfg.c_m) and z2.shape == (2, 22, 22, cfg.c_z)
    assert torch.equal(m2, m) and torch.equal(z2, z)
    _randomize(block)
    m3, z3 = block(m, z, torch.ones(2, 13, 22), torch.ones(2, 22, 22))
    assert not torch.allclose(m3, m) and not torch.allclose(z3, z)


def test_triangle_multiplication_matches_loops():
    torch.manual_seed(0)
    for outgoing in (True, False):
        tri = TriangleMultiplication(c_z=3, c_hidden=2, outgoing=outgoing)
        _randomize(tri, seed=1)
        z, mask = torch.randn(5, 5, 3), torch.ones(5, 5)
        zn = tri.norm_in(z)
        a = torch.sigmoid(tri.linear_a_g(zn)) * tri.linear_a_p(zn)
        b = torch.sigmoid(tri.linear_b_g(zn)) * tri.linear_b_p(zn)
        x = torch.zeros(5, 5, 2)
        for i in range(5):
            for j in range(5):
                for k in range(5):
                    x[i, j] += a[i, k] * b[j, k] if outgoing else a[k, i] * b[k, j]
        expect = torch.sigmoid(tri.linear_g(zn)) * tri.linear_z(tri.norm_out(x))
        assert torch.allclose(tri(z, mask), expect, atol=1e-5)


def test_outer_product_mean_matches_loops_and_chunks():
    torch.manual_seed(0)
    opm = OuterProductMean(c_m=4, c_z=3, c_hidden=2)
    _randomize(opm)
    m, mask = torch.randn(7, 5, 4), (torch.rand(7, 5) > 0.3).float()
    mn = opm.norm(m)
    a, b = opm.linear_a(mn) * mask[..., None], opm.linear_b(mn) * mask[..., None]
    expect = torch.zeros(5, 5, 3)
    for i in range(5):
        for j in range(5):
            outer = sum(torch.outer(a[s, i], b[s, j]) for s in range(7))
            norm = (mask[:, i] * mask[:, j]).sum() + 1e-3
            expect[i, j] = opm.linear_out(outer.flatten()) / norm
    assert torch.allclose(opm(m, mask), expect, atol=1e-5)
    assert torch.allclose(opm(m, mask, chunk_size=2), expect, atol=1e-5)
    mask[:, 1] = 0     # residue 1 has no rows: AF2 gives its pairs bias / 1e-3, so do we
    out = opm(m, mask, chunk_size=2)
    assert torch.allclose(out[1], (opm.linear_out.bias / 1e-3).expand(5, 3), rtol=1e-6)
    assert torch.allclose(out[:, 1], (opm.linear_out.bias / 1e-3).expand(5, 3), rtol=1e-6)


def test_chunked_model_equals_unchunked():
    batch = random_batch(L=22, N=13, B=1)
    torch.manual_seed(0)
    model = build_model(tiny_config(), verbose=False).eval()
    _randomize(model, scale=0.2)
    chunked = build_model(tiny_config(chunk_size=3), verbose=False).eval()
    chunked.load_state_dict(model.state_dict())
    with torch.no_grad():
        a, b = model(batch, num_recycles=1), chunked(batch, num_recycles=1)
    for key in ("final_atom_positions", "distogram_logits", "plddt", "masked_msa_logits"):
        assert torch.allclose(a[key], b[key], atol=1e-4, rtol=1e-4), key


def test_padding_never_changes_real_outputs():
    L, N, L_pad, N_pad = 22, 13, 29, 17
    batch = random_batch(L=L, N=N, B=None, seed=3)
    padded = pad_batch(batch, L_pad, N_pad)
    torch.manual_seed(0)
    model = build_model(tiny_config(extra_msa=False), verbose=False).eval()
    _randomize(model, scale=0.2)
    with torch.no_grad():
        a, b = model(batch, num_recycles=1), model(padded, num_recycles=1)
    assert torch.allclose(a["final_atom_positions"], b["final_atom_positions"][:L], atol=1e-4)
    assert torch.allclose(a["distogram_logits"], b["distogram_logits"][:L, :L], atol=1e-4)
    assert torch.allclose(a["masked_msa_logits"], b["masked_msa_logits"][:N, :L], atol=1e-4)
    assert torch.allclose(a["plddt"], b["plddt"][:L], atol=1e-4)


def test_recompute_gives_same_gradients():
    batch = random_batch(L=11, N=5, B=1)
    grads = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = build_model(tiny_config(recompute=recompute), verbose=False).train()
        _randomize(model, scale=0.2)
        torch.manual_seed(1)                       # same dropout masks in both runs
        out = model(batch, num_recycles=0)
        (out["distogram_logits"].sum() + out["final_atom_positions"].sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def _gated_attention_reference(att, x_q, x_kv, bias_fn, mask_k):
    """Alg. 7/13/14 written per query with explicit sums: x_q [C], x_kv [K, C], bias_fn(h, k)."""
    H, c = att.n_heads, att.c_hidden
    q = att.linear_q(x_q).view(H, c)
    k = att.linear_k(x_kv).view(-1, H, c)
    v = att.linear_v(x_kv).view(-1, H, c)
    g = torch.sigmoid(att.linear_g(x_q)).view(H, c)
    out = []
    for h in range(H):
        logits = torch.stack([q[h] @ k[kk, h] / c ** 0.5 + bias_fn(h, kk) for kk in range(len(x_kv))])
        logits = logits.masked_fill(mask_k == 0, -1e9)
        w = torch.softmax(logits, 0)
        out.append(g[h] * (w[:, None] * v[:, h]).sum(0))
    return att.linear_o(torch.cat(out))


def test_triangle_attention_matches_algorithms_13_and_14():
    from protdp.model.evoformer import TriangleAttention
    torch.manual_seed(0)
    L, C = 5, 4
    z = torch.randn(L, L, C)
    mask = torch.ones(L, L)
    mask[3, 1] = 0
    for starting in (True, False):
        tri = TriangleAttention(C, 3, 2, starting=starting)
        _randomize(tri, seed=2)
        zn = tri.norm(z)
        b = tri.linear_b(zn)                                                  # [L, L, H]
        out = tri(z, mask)
        for i in range(L):
            for j in range(L):
                if starting:   # Alg. 13: (i, j) attends to (i, k), bias b_jk, mask on (i, k)
                    ref = _gated_attention_reference(tri.attention, zn[i, j], zn[i], lambda h, k: b[j, k, h],
                                                     mask[i])
                else:          # Alg. 14: (i, j) attends to (k, j), bias b_ki, mask on (k, j)
                    ref = _gated_attention_reference(tri.attention, zn[i, j], zn[:, j], lambda h, k: b[k, i, h],
                                                     mask[:, j])
                assert torch.allclose(out[i, j], ref, atol=1e-5), (starting, i, j)


def test_msa_row_attention_pair_bias_orientation():
    from protdp.model.evoformer import MSARowAttentionWithPairBias
    torch.manual_seed(0)
    S, L, Cm, Cz = 3, 4, 6, 5
    row = MSARowAttentionWithPairBias(Cm, Cz, 3, 2)
    _randomize(row, seed=3)
    m, z, mask = torch.randn(S, L, Cm), torch.randn(L, L, Cz), torch.ones(S, L)
    mask[1, 2] = 0
    out = row(m, z, mask)
    mn, b = row.norm_m(m), row.linear_b(row.norm_z(z))                        # b [L, L, H]
    for s in range(S):
        for i in range(L):   # Alg. 7: query (s, i), key (s, j), bias b_ij
            ref = _gated_attention_reference(row.attention, mn[s, i], mn[s], lambda h, j: b[i, j, h], mask[s])
            assert torch.allclose(out[s, i], ref, atol=1e-5)


def test_inplace_inference_block_equals_graph_path():
    """The eval-mode no-grad block (evoformer_inference: in place, row-streamed triangle
    multiplication, chunked biases) equals the autograd path for every chunk size, both block
    orders and the extra-MSA (global column) block, with masks; the caller's m, z are untouched."""
    torch.manual_seed(0)
    S, L = 7, 11
    msa_mask = (torch.rand(2, S, L) > 0.2).double()
    pair_mask = (torch.rand(2, L, L) > 0.2).double()
    for global_column, opm_first in ((False, False), (False, True), (True, False)):
        cfg = tiny_config()
        block = EvoformerBlock(cfg, cfg.c_m, cfg.c_hidden_msa_att, global_column=global_column)
        block.outer_product_first = opm_first
        _randomize(block, scale=0.2, seed=2)
        block = block.double().eval()
        m, z = torch.randn(2, S, L, cfg.c_m).double(), torch.randn(2, L, L, cfg.c_z).double()
        m0, z0 = m.clone(), z.clone()
        with torch.enable_grad():
            ref_m, ref_z = block(m, z, msa_mask, pair_mask)
        for chunk in (None, 1, 3, 16):
            block.chunk_size = chunk
            with torch.no_grad():
                got_m, got_z = block(m, z, msa_mask, pair_mask)
            assert torch.equal(m, m0) and torch.equal(z, z0)
            assert torch.allclose(got_m, ref_m, atol=1e-12, rtol=1e-10), (global_column, opm_first, chunk)
            assert torch.allclose(got_z, ref_z, atol=1e-12, rtol=1e-10), (global_column, opm_first, chunk)
        block = block.float()
        with torch.enable_grad():
            ref_m, ref_z = block(m.float(), z.float(), msa_mask.float(), pair_mask.float())
        block.chunk_size = 3
        with torch.no_grad():
            got_m, got_z = block(m.float(), z.float(), msa_mask.float(), pair_mask.float())
        assert torch.allclose(got_m, ref_m, atol=1e-5, rtol=1e-5)
        assert torch.allclose(got_z, ref_z, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("global_column", [False, True])
def test_fused_training_path_gives_the_module_path_gradients(monkeypatch, global_column):
    """Training stores less (LayerNorm outputs, gated triangle operands and outer products are
    recomputed in backward): outputs and every gradient equal the plain module path (fp64),
    for the Evoformer block and the extra-MSA block (global column attention, Alg. 19)."""
    from protdp.model import evoformer, primitives
    torch.manual_seed(0)
    cfg = tiny_config()
    block = EvoformerBlock(cfg, cfg.c_m, cfg.c_hidden_msa_att, global_column=global_column)
    _randomize(block, scale=0.2, seed=4)
    block = block.double().eval()                 # no dropout; autograd on: the graph path
    m, z = torch.randn(2, 5, 9, cfg.c_m).double(), torch.randn(2, 9, 9, cfg.c_z).double()
    msa_mask, pair_mask = (torch.rand(2, 5, 9) > 0.2).double(), (torch.rand(2, 9, 9) > 0.2).double()
    monkeypatch.setattr(evoformer, "OUTER_CHUNK_ELEMENTS", 50)     # several recomputed chunks

    def run():
        block.zero_grad()
        mi, zi = m.clone().requires_grad_(), z.clone().requires_grad_()
        mo, zo = block(mi, zi, msa_mask, pair_mask)
        (mo.sin().sum() + zo.cos().sum()).backward()
        return [mo, zo, mi.grad, zi.grad] + [p.grad.clone() for p in block.parameters()]

    fused = run()
    for module in (evoformer, primitives):
        monkeypatch.setattr(module, "fused_projection_enabled", lambda: False)
    plain = run()
    names = ["m", "z", "d_m", "d_z"] + [n for n, _ in block.named_parameters()]
    for name, a, b in zip(names, fused, plain):
        assert torch.allclose(a, b, atol=1e-12, rtol=1e-10), (name, (a - b).abs().max())


def test_outer_linear_gradients_equal_the_einsum_reference(monkeypatch):
    """_OuterLinear (outer products laid out [c, I*J, d], recomputed in row chunks in backward)
    gives the output and the a, b, weight and bias gradients of einsum -> Linear (fp64), with
    two leading batch dimensions and a row chunk that does not divide I."""
    from protdp.model import evoformer
    monkeypatch.setattr(evoformer, "OUTER_CHUNK_ELEMENTS", 2 * 7 * 3 * 4)   # 2 rows of 5
    g = torch.Generator().manual_seed(3)
    a_t = torch.randn(2, 1, 5, 6, 3, generator=g, dtype=torch.float64)      # [*, I, S, c]
    b = torch.randn(2, 1, 6, 7, 4, generator=g, dtype=torch.float64)        # [*, S, J, d]
    w = torch.randn(8, 12, generator=g, dtype=torch.float64)
    bias = torch.randn(8, generator=g, dtype=torch.float64)
    d_y = torch.randn(2, 1, 5, 7, 8, generator=g, dtype=torch.float64)

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in (a_t, b, w, bias)]
        y = fn(*leaves)
        y.backward(d_y)
        return [y] + [t.grad for t in leaves]

    got = grads(evoformer._OuterLinear.apply)
    ref = grads(lambda a, bb, ww, bi: torch.nn.functional.linear(
        torch.einsum("...isc,...sjd->...ijcd", a, bb).flatten(-2), ww, bi))
    for name, x, y in zip(("y", "d_a", "d_b", "d_w", "d_bias"), got, ref):
        assert torch.allclose(x, y, atol=1e-12, rtol=1e-10), (name, (x - y).abs().max())
