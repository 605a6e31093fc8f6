"""Losses (Alg. 26-29, §1.9): FAPE invariances and clamp, masking, AF2 weights, known
cross-entropies, pLDDT targets, non-finite inputs; all-atom terms on constructed structures:
a perfect all-atom prediction scores ~0, the symmetric-atom renaming (Alg. 26), pi-periodic chis
(Alg. 27), structural violations (§1.9.11) and the experimentally-resolved loss (§1.9.10)."""

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


# ---------------------------------------------------------------- all-atom terms on ideal residues
def _ideal_structure(aatype, seed=0, spacing=25.0):
    """Residues of ideal geometry under random rotations, `spacing` Å apart, random torsions:
    (group frames [L, 8], atom14 [L, 14, 3], atom37 [L, 37, 3], torsions [L, 7, 2])."""
    from protdp.model.all_atom import atom14_to_atom37, frames_to_atom14, torsion_angles_to_frames
    g = torch.Generator().manual_seed(seed)
    L = aatype.shape[0]
    trans = torch.zeros(L, 3, dtype=torch.float64)
    trans[:, 0] = spacing * torch.arange(L, dtype=torch.float64)
    frames = Rigid(quat_to_rot(torch.randn(L, 4, generator=g, dtype=torch.float64)), trans)
    angles = torch.nn.functional.normalize(torch.randn(L, 7, 2, generator=g, dtype=torch.float64), dim=-1)
    groups = torsion_angles_to_frames(aatype, frames, angles)
    x14 = frames_to_atom14(aatype, groups)
    return groups, x14, atom14_to_atom37(x14, aatype), angles


def _outputs_for(aatype, groups, x14, x37, angles, layers=2):
    """A structure-module output dict that predicts exactly this structure."""
    bb = groups.index((..., 0)).to_tensor_4x4()
    return {"sm": {"frames": bb.expand((layers,) + bb.shape), "angles": angles.expand((layers,) + angles.shape),
                   "sidechain_frames": groups.to_tensor_4x4(), "atom14_positions": x14},
            "final_atom_positions": x37}


def _truth_batch(aatype, x37, residue_gap=2):
    from protdp.model.all_atom import atom37_exists
    L = aatype.shape[0]
    return {"aatype": aatype, "seq_mask": torch.ones(L, dtype=torch.float64),
            "residue_index": torch.arange(L) * residue_gap,        # gaps: no peptide bonds
            "all_atom_positions": x37, "all_atom_mask": atom37_exists(aatype, torch.float64),
            "resolution": torch.tensor(2.0)}


def test_perfect_all_atom_prediction_scores_zero_and_renaming_finds_the_swap():
    from protdp.model.losses import alt_naming_is_better, structure_losses
    from protdp.model.ground_truth import structure_truth
    from protdp.model.all_atom import atom14_to_atom37, alt_atom14, atom14_exists
    aatype = torch.arange(20)
    groups, x14, x37, angles = _ideal_structure(aatype)
    lc = tiny_config().loss
    out = _outputs_for(aatype, groups, x14, x37, angles)
    terms = structure_losses(out, _truth_batch(aatype, x37), lc)
    floor = math.sqrt(lc.fape_eps) / lc.fape_length_scale                # sqrt(eps) / Z
    assert terms["fape"] < floor * 1.01 and terms["backbone_fape"] < floor * 1.01
    assert terms["torsion"] < 1e-7                                      # sqrt(1 + eps) - 1
    # truth with the symmetric atoms named the other way round: renaming restores a perfect fit
    swapped14, _ = alt_atom14(aatype, x14, atom14_exists(aatype, torch.float64))
    batch = _truth_batch(aatype, atom14_to_atom37(swapped14, aatype))
    alt = alt_naming_is_better(structure_truth(batch), x14)
    assert set(torch.nonzero(alt)[:, 0].tolist()) == {3, 6, 13, 18}      # D, E, F, Y
    renamed = structure_losses(out, batch, lc)
    # (the alternative frame is the 180-degree turn; the literature O positions are symmetric
    # only to ~0.02 Å, which is all that remains)
    assert renamed["fape"] < 3 * floor
    # a real error is seen: one side chain moved by 3 Å raises the all-atom FAPE only
    moved = x14.clone()
    moved[11, 5:] += 3.0                                                 # LYS CG..NZ
    bad = structure_losses(dict(out, sm=dict(out["sm"], atom14_positions=moved)), batch, lc)
    assert bad["fape"] > 10 * floor and bad["backbone_fape"] < floor * 1.01


def test_torsion_loss_is_pi_periodic_only_where_the_chemistry_is():
    from protdp.model.losses import structure_losses
    aatype = torch.tensor([3, 11])                                       # ASP (chi2 periodic), LYS
    groups, x14, x37, angles = _ideal_structure(aatype, seed=1)
    lc = tiny_config(loss={"angle_norm_weight": 0.0}).loss
    batch = _truth_batch(aatype, x37)
    flipped = angles.clone()
    flipped[0, 4] = -flipped[0, 4]                                       # ASP chi2 + pi
    out = _outputs_for(aatype, groups, x14, x37, flipped)
    assert structure_losses(out, batch, lc)["torsion"] < 1e-7     # sqrt(1 + eps) - 1 norm term
    flipped[1, 3] = -flipped[1, 3]                                       # LYS chi1 + pi: error 4
    out = _outputs_for(aatype, groups, x14, x37, flipped)
    n_chis = 2 + 4
    assert structure_losses(out, batch, lc)["torsion"] == pytest.approx(4.0 / n_chis, rel=1e-6)
    # the angle-norm penalty acts on the raw (unnormalised) torsions
    lc_norm = tiny_config(loss={"angle_norm_weight": 0.02}).loss
    out = _outputs_for(aatype, groups, x14, x37, angles * 2.0)
    assert structure_losses(out, batch, lc_norm)["torsion"] == pytest.approx(0.02 * 1.0, rel=1e-4)


def test_violation_loss_zero_for_ideal_residues_and_grows_with_errors():
    """Ideal residues (all types but proline, whose ring closes only at its own chi1/chi2, not
    at random ones) far apart and not chained violate nothing."""
    from protdp.model.violations import violation_loss
    aatype = torch.tensor([r for r in range(20) if r != 14] + [0])
    _, x14, _, _ = _ideal_structure(aatype, seed=2)
    index, mask = torch.arange(20) * 2, torch.ones(20, dtype=torch.float64)
    assert violation_loss(x14, aatype, index, mask) == pytest.approx(0.0, abs=1e-9)
    stretched = x14.clone()
    stretched[0, 4] += torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64)    # ALA CB pulled 2 Å
    assert violation_loss(stretched, aatype, index, mask) > 0.01
    close = x14.clone()                                                  # residue 1 onto residue 0
    close[1] = x14[1] - x14[1, 1] + x14[0, 1] + torch.tensor([0.5, 0.0, 0.0], dtype=torch.float64)
    assert violation_loss(close, aatype, index, mask) > 0.05           # clashes / all atoms
    # consecutive residue numbers switch on the peptide-bond terms: far apart, they are violated
    assert violation_loss(x14, aatype, torch.arange(20), mask) > 1.0
    padded = torch.ones(20, dtype=torch.float64)
    padded[0] = 0.0                                                      # padding is ignored
    assert violation_loss(stretched, aatype, index, padded) == pytest.approx(0.0, abs=1e-9)


def test_experimentally_resolved_loss_is_the_masked_sigmoid_cross_entropy():
    from protdp.model.ground_truth import structure_truth
    from protdp.model.losses import experimentally_resolved_loss
    from protdp.model.all_atom import atom37_exists
    aatype = torch.tensor([0, 7, 18])
    _, _, x37, _ = _ideal_structure(aatype, seed=3)
    batch = _truth_batch(aatype, x37)
    batch["all_atom_mask"] = batch["all_atom_mask"].clone()
    batch["all_atom_mask"][2, 5:] = 0.0                                  # TYR ring unobserved
    logits = torch.randn(3, 37, generator=torch.Generator().manual_seed(0))
    lc = tiny_config().loss
    got = experimentally_resolved_loss(logits, structure_truth(batch), batch, lc)
    exists = atom37_exists(aatype).bool()
    label = batch["all_atom_mask"][exists].float()
    p = torch.sigmoid(logits[exists])
    ref = -(label * torch.log(p) + (1 - label) * torch.log(1 - p)).mean()
    assert got == pytest.approx(float(ref), rel=1e-5)
    batch["resolution"] = torch.tensor(4.5)                              # outside [0.1, 3] Å
    assert experimentally_resolved_loss(logits, structure_truth(batch), batch, lc) == 0
