"""Losses (Alg. 27-29, §1.9): FAPE invariances and clamp, masking, AF2 weights, known
cross-entropies, pLDDT targets, non-finite inputs."""

import math

import pytest
import torch

from model_fixtures import random_batch, tiny_config, one_thread  # noqa: F401
from protdp.errors import InputError
from protdp.model import build_model
from protdp.model.losses import NonFiniteError, compute_loss, fape
from protdp.model.rigid import Rigid, quat_to_rot


def _rigid(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return Rigid(quat_to_rot(torch.randn(*shape, 4, generator=g)), torch.randn(*shape, 3, generator=g) * 8)


def _global(rigid: Rigid, g: Rigid) -> Rigid:
    return Rigid(g.rot.expand_as(rigid.rot), g.trans.expand_as(rigid.trans)).compose(rigid)


def test_fape_invariant_under_separate_global_transforms():
    L = 11
    pf, tf = _rigid((L,), 0), _rigid((L,), 1)
    px, tx = torch.randn(L, 3) * 8, torch.randn(L, 3) * 8
    fm, pm = torch.ones(L), torch.ones(L)
    base = fape(pf, tf, fm, px, tx, pm)
    g1, g2 = _rigid((), 2), _rigid((), 3)
    moved = fape(_global(pf, g1), _global(tf, g2), fm, g1.apply(px), g2.apply(tx), pm)
    assert torch.allclose(base, moved, atol=1e-5)
    assert fape(pf, pf, fm, px, px, pm) < 1e-3                          # sqrt(eps)/Z
    # a reflection of the prediction is NOT invariant (FAPE sees chirality)
    flip = torch.diag(torch.tensor([1.0, 1.0, -1.0]))
    mirrored = Rigid(flip @ tf.rot @ flip, tf.trans @ flip)
    assert fape(mirrored, tf, fm, tx @ flip, tx, pm) > 0.05


def test_fape_clamp_and_length_scale():
    L = 5
    tf = _rigid((L,), 4)
    tx = torch.randn(L, 3)
    far = tx + 1000.0
    ones = torch.ones(L)
    assert torch.allclose(fape(tf, tf, ones, far, tx, ones), torch.tensor(1.0), atol=1e-5)
    assert fape(tf, tf, ones, far, tx, ones, clamp=None) > 100
    # masked points are ignored
    mask = torch.tensor([1.0, 1, 1, 1, 0])
    px = tx.clone()
    px[4] += 50
    assert fape(tf, tf, ones, px, tx, mask) < 1e-3


def _outputs_and_batch(seed=0, **cfg_overrides):
    batch = random_batch(L=13, N=5, B=2, seed=seed)
    torch.manual_seed(seed)
    cfg = tiny_config(**cfg_overrides)
    model = build_model(cfg, verbose=False).eval()
    with torch.no_grad():
        out = model(batch, num_recycles=0)
    return model, out, batch


def test_compute_loss_weights_and_known_values_at_init():
    model, out, batch = _outputs_and_batch()
    total, terms = compute_loss(out, batch, model.config)
    lc = model.config.loss
    expect = (lc.fape_weight * terms["fape"] + lc.aux_weight * terms["aux"]
              + lc.distogram_weight * terms["distogram"] + lc.masked_msa_weight * terms["masked_msa"]
              + lc.plddt_weight * terms["plddt"])
    assert torch.allclose(total, expect)
    assert lc.fape_weight == 0.5 and lc.aux_weight == 0.5 and lc.distogram_weight == 0.3
    assert lc.masked_msa_weight == 2.0 and lc.plddt_weight == 0.01
    # zero-initialised heads give uniform distributions: CE = log(n_bins)
    assert terms["distogram"] == pytest.approx(math.log(64), rel=1e-5)
    assert terms["masked_msa"] == pytest.approx(math.log(23), rel=1e-5)
    assert terms["plddt"] == pytest.approx(math.log(50), rel=1e-5)
    assert all(v.dim() == 0 and torch.isfinite(v) for v in terms.values())


def test_losses_ignore_masked_residues_and_atoms():
    model, out, batch = _outputs_and_batch(seed=1)
    base, _ = compute_loss(out, batch, model.config)
    changed = dict(batch)
    changed["seq_mask"] = batch["seq_mask"].clone()
    changed["seq_mask"][:, -3:] = 0
    masked_base, _ = compute_loss(out, changed, model.config)
    pos = batch["backbone_positions"].clone()
    pos[:, -3:] += 30.0
    changed["backbone_positions"] = pos
    masked_moved, _ = compute_loss(out, changed, model.config)
    assert torch.allclose(masked_base, masked_moved)
    # a missing atom's coordinate does not matter either
    changed2 = dict(batch)
    changed2["backbone_mask"] = batch["backbone_mask"].clone()
    changed2["backbone_mask"][:, 4, 3] = 0
    a, _ = compute_loss(out, changed2, model.config)
    pos2 = batch["backbone_positions"].clone()
    pos2[:, 4, 3] += 40.0
    changed2["backbone_positions"] = pos2
    b, _ = compute_loss(out, changed2, model.config)
    assert torch.allclose(a, b)
    assert not torch.allclose(base, masked_base)


def test_plddt_target_and_resolution_filter():
    model, out, batch = _outputs_and_batch(seed=2)
    # a perfect prediction has lDDT 1 -> the target is the top bin
    out = dict(out)
    out["final_atom_positions"] = batch["backbone_positions"].clone()
    logits = torch.full_like(out["plddt_logits"], -20.0)
    logits[..., -1] = 20.0
    out["plddt_logits"] = logits
    _, terms = compute_loss(out, batch, model.config)
    assert terms["plddt"] < 1e-6
    logits = torch.full_like(logits, -20.0)
    logits[..., 0] = 20.0
    out["plddt_logits"] = logits
    _, terms = compute_loss(out, batch, model.config)
    assert terms["plddt"] > 30
    batch = dict(batch, resolution=torch.tensor([5.0, 5.0]))            # outside [0.1, 3] Å
    _, terms = compute_loss(out, batch, model.config)
    assert terms["plddt"] == 0


def test_pae_head_and_loss():
    model, out, batch = _outputs_and_batch(seed=3, pae_head=True)
    assert out["pae"].shape == (2, 13, 13) and out["ptm"].shape == (2,)
    assert torch.all((out["ptm"] > 0) & (out["ptm"] <= 1))
    total, terms = compute_loss(out, batch, model.config)
    assert terms["pae"] == pytest.approx(math.log(64), rel=1e-5)


def test_non_finite_inputs_raise():
    model, out, batch = _outputs_and_batch(seed=4)
    bad = dict(out)
    bad["final_atom_positions"] = out["final_atom_positions"].clone()
    bad["final_atom_positions"][0, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="final_atom_positions"):
        compute_loss(bad, batch, model.config)
    bad_batch = dict(batch)
    bad_batch["backbone_positions"] = batch["backbone_positions"].clone()
    bad_batch["backbone_positions"][1, 2, 1, 0] = float("inf")
    with pytest.raises(InputError, match="backbone_positions"):
        compute_loss(out, bad_batch, model.config)
    # unknown resolution (NaN) is allowed
    total, _ = compute_loss(out, dict(batch, resolution=torch.tensor([float("nan")] * 2)), model.config)
    assert torch.isfinite(total)
