"""All-atom geometry (Alg. 24-25, Table 2): ideal side chains for all 20 residue types, atom14 <->
atom37, torsions from atoms and back (checked against Biopython's dihedral), ground-truth frames,
ambiguous-atom swaps, and the residue tables against the literature bond lengths."""

import math

import numpy as np
import pytest
import torch
from Bio.PDB.vectors import Vector, calc_dihedral

from model_fixtures import one_thread  # noqa: F401
from protdp.data import residue_constants as rc
from protdp.data.stereo_chemical_props import bond_lengths
from protdp.model.all_atom import (alt_atom14, atom14_exists, atom14_to_atom37, atom37_exists,
                                   atom37_to_atom14, atom37_to_frames, atom37_to_torsion_angles,
                                   frames_to_atom14, torsion_angles_to_frames)
from protdp.model.rigid import Rigid, quat_to_rot

F64 = torch.float64
RING_CLOSURES = {("PRO", "CD", "N")}     # closes only at the right chi1/chi2, not at random ones


def _random_residues(n_copies: int = 3, seed: int = 0):
    """Every residue type n_copies times under random frames and random torsions (float64)."""
    g = torch.Generator().manual_seed(seed)
    aatype = torch.arange(20).repeat(n_copies)
    L = aatype.shape[0]
    frames = Rigid(quat_to_rot(torch.randn(L, 4, generator=g, dtype=F64)),
                   torch.randn(L, 3, generator=g, dtype=F64) * 10)
    angles = torch.nn.functional.normalize(torch.randn(L, 7, 2, generator=g, dtype=F64), dim=-1)
    return aatype, frames, angles


def _build(aatype, frames, angles):
    group_frames = torsion_angles_to_frames(aatype, frames, angles)
    x14 = frames_to_atom14(aatype, group_frames)
    return group_frames, x14, atom14_to_atom37(x14, aatype)


def test_bond_lengths_are_the_literature_geometry_for_every_residue_type():
    aatype, frames, angles = _random_residues()
    _, _, x37 = _build(aatype, frames, angles)
    _, _, x37_other = _build(aatype, frames, torch.roll(angles, 1, dims=0))
    worst = 0.0
    checked = 0
    for i, r in enumerate(aatype.tolist()):
        name = rc.RESTYPE_3[r]
        for a1, a2, mean, sd in bond_lengths()[name]:
            if (name, a1, a2) in RING_CLOSURES or (name, a2, a1) in RING_CLOSURES:
                continue
            j1, j2 = rc.ATOM_ORDER[a1], rc.ATOM_ORDER[a2]
            d = (x37[i, j1] - x37[i, j2]).norm().item()
            d_other = (x37_other[i, j1] - x37_other[i, j2]).norm().item()
            assert d == pytest.approx(d_other, abs=1e-6), (name, a1, a2)   # float32 tables
            worst = max(worst, abs(d - mean) / sd)
            checked += 1
    assert checked > 400
    assert worst < 3.0, worst      # AF2's idealised positions vs Engh & Huber: within 3 sigma


def test_atom_masks_and_layout_round_trip():
    aatype, frames, angles = _random_residues()
    _, x14, x37 = _build(aatype, frames, angles)
    ex14, ex37 = atom14_exists(aatype, F64), atom37_exists(aatype, F64)
    assert torch.equal(ex14.sum(-1), ex37.sum(-1))
    assert torch.all(x14[ex14 == 0] == 0) and torch.all(x37[ex37 == 0] == 0)
    assert torch.equal(atom37_to_atom14(x37, aatype), x14)
    assert torch.equal(atom14_to_atom37(atom37_to_atom14(x37, aatype), aatype), x37)
    # glycine has no CB, X has no atoms at all
    assert ex37[aatype == 7, rc.ATOM_ORDER["CB"]].sum() == 0
    assert atom37_exists(torch.tensor([20])).sum() == 0
    # the backbone sits where the backbone frame puts the ideal N, CA, C
    assert torch.allclose(x37[:, 1], frames.trans, atol=1e-12)


def _dihedral(p):
    return calc_dihedral(*[Vector(*map(float, x)) for x in p])


def test_torsions_from_atoms_match_input_and_biopython():
    aatype, frames, angles = _random_residues(seed=1)
    _, _, x37 = _build(aatype, frames, angles)
    mask37 = atom37_exists(aatype, F64)
    tors = atom37_to_torsion_angles(aatype[None], x37[None], mask37[None])
    sin_cos, tmask = tors["sin_cos"][0], tors["mask"][0]
    # omega/phi of residue i need residue i-1, which is an unrelated random residue here
    assert torch.all(tmask[0, :2] == 0)
    chi_exists = torch.as_tensor(rc.CHI_ANGLES_MASK)[aatype]
    assert torch.equal(tmask[:, 3:], chi_exists.to(F64))
    assert torch.all(tmask[:, 2] == 1)
    sel = tmask[:, 2:] > 0
    assert torch.allclose(sin_cos[:, 2:][sel], angles[:, 2:][sel], atol=1e-6)
    # independent check of the convention: chi_k is the dihedral of its 4 atoms, psi (from O)
    # is dihedral(N, CA, C, O) + 180 degrees
    for i, r in enumerate(aatype.tolist()):
        name = rc.RESTYPE_3[r]
        for k, atoms in enumerate(rc.CHI_ANGLES_ATOMS[name]):
            ref = _dihedral([x37[i, rc.ATOM_ORDER[a]] for a in atoms])
            got = math.atan2(sin_cos[i, 3 + k, 0], sin_cos[i, 3 + k, 1])
            assert math.remainder(got - ref, 2 * math.pi) == pytest.approx(0.0, abs=1e-6)
        ref_psi = _dihedral([x37[i, rc.ATOM_ORDER[a]] for a in ("N", "CA", "C", "O")]) + math.pi
        got_psi = math.atan2(sin_cos[i, 2, 0], sin_cos[i, 2, 1])
        assert math.remainder(got_psi - ref_psi, 2 * math.pi) == pytest.approx(0.0, abs=1e-6)
    # pi-periodic chis: the alternative is shifted by pi, the others are unchanged
    periodic = torch.as_tensor(rc.CHI_PI_PERIODIC)[aatype].bool()
    alt = tors["alt_sin_cos"][0][:, 3:]
    assert torch.allclose(alt[periodic], -sin_cos[:, 3:][periodic])
    assert torch.equal(alt[~periodic], sin_cos[:, 3:][~periodic])


def test_omega_phi_between_consecutive_residues():
    """A chain: omega and phi of residue i come from residue i-1 (Biopython's dihedrals)."""
    aatype, frames, angles = _random_residues(n_copies=1, seed=2)
    _, _, x37 = _build(aatype, frames, angles)
    tors = atom37_to_torsion_angles(aatype, x37, atom37_exists(aatype, F64))
    n, ca, c = rc.ATOM_ORDER["N"], rc.ATOM_ORDER["CA"], rc.ATOM_ORDER["C"]
    for i in range(1, len(aatype)):
        omega = _dihedral([x37[i - 1, ca], x37[i - 1, c], x37[i, n], x37[i, ca]])
        phi = _dihedral([x37[i - 1, c], x37[i, n], x37[i, ca], x37[i, c]])
        for t, ref in ((0, omega), (1, phi)):
            got = math.atan2(tors["sin_cos"][i, t, 0], tors["sin_cos"][i, t, 1])
            assert math.remainder(got - ref, 2 * math.pi) == pytest.approx(0.0, abs=1e-6)


def test_ground_truth_frames_recover_the_rigid_groups():
    aatype, frames, angles = _random_residues(seed=3)
    group_frames, _, x37 = _build(aatype, frames, angles)
    gt = atom37_to_frames(aatype, x37, atom37_exists(aatype, F64))
    exists = gt["gt_exists"].bool()
    assert torch.equal(gt["group_exists"], gt["gt_exists"])
    assert torch.all(exists[:, 0]) and torch.all(exists[:, 3]) and not exists[:, 1:3].any()
    assert torch.allclose(gt["frames"].rot[exists], group_frames.rot[exists], atol=1e-6)
    assert torch.allclose(gt["frames"].trans[exists], group_frames.trans[exists], atol=1e-6)
    # the alternative frame of an ambiguous group is the same frame turned 180 degrees about x
    amb = gt["is_ambiguous"].bool()
    assert amb.sum() == 4 * 3                                    # D, E, F, Y x 3 copies
    flip = torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=F64))
    assert torch.allclose(gt["alt_frames"].rot[amb], gt["frames"].rot[amb] @ flip)
    assert torch.equal(gt["alt_frames"].rot[~amb], gt["frames"].rot[~amb])


def test_ambiguous_atom_swap():
    aatype, frames, angles = _random_residues(seed=4)
    _, x14, _ = _build(aatype, frames, angles)
    mask14 = atom14_exists(aatype, F64)
    alt, alt_mask = alt_atom14(aatype, x14, mask14)
    back, _ = alt_atom14(aatype, alt, alt_mask)
    assert torch.equal(back, x14) and torch.equal(alt_mask, mask14)
    asp = int(torch.nonzero(aatype == 3)[0])
    names = rc.RESTYPE_ATOM14_NAMES["ASP"]
    od1, od2 = names.index("OD1"), names.index("OD2")
    assert torch.equal(alt[asp, od1], x14[asp, od2]) and torch.equal(alt[asp, od2], x14[asp, od1])
    # a pi flip of ASP chi2 places OD1 where OD2 was: the swap is a symmetry of the residue
    flipped = angles.clone()
    flipped[asp, 4] = -flipped[asp, 4]
    _, x14_flipped, _ = _build(aatype, frames, flipped)
    assert torch.allclose(x14_flipped[asp, od1], x14[asp, od2], atol=0.05)
    changed = (alt != x14).any(-1).any(-1)
    assert set(aatype[changed].tolist()) == {3, 6, 13, 18}       # D, E, F, Y


def test_gradients_flow_through_the_geometry():
    aatype, frames, angles = _random_residues(n_copies=1, seed=5)
    angles = angles.clone().requires_grad_(True)
    trans = frames.trans.clone().requires_grad_(True)
    _, x14, _ = _build(aatype, Rigid(frames.rot, trans), angles)
    x14.sum().backward()
    assert torch.isfinite(angles.grad).all() and angles.grad[:, 3:].abs().sum() > 0
    assert torch.allclose(trans.grad, atom14_exists(aatype, F64).sum(-1)[:, None].expand(-1, 3))


def test_tables_have_the_documented_shapes():
    assert rc.RESTYPE_RIGID_GROUP_DEFAULT_FRAME.shape == (21, 8, 4, 4)
    assert rc.RESTYPE_ATOM14_RIGID_GROUP_POSITIONS.shape == (21, 14, 3)
    bounds = rc.atom14_distance_bounds(1.5, 12.0)
    assert bounds["lower_bound"].shape == (21, 14, 14)
    assert np.all(bounds["upper_bound"] >= bounds["lower_bound"])
    # a real bond (ALA CA-CB) gets mean +- 12 sigma, a non-bonded pair only the clash bound
    ala = rc.RESTYPE_ATOM14_NAMES["ALA"]
    ca, cb, o = ala.index("CA"), ala.index("CB"), ala.index("O")
    assert bounds["lower_bound"][0, ca, cb] == pytest.approx(1.520 - 12 * 0.021, abs=1e-6)
    assert bounds["upper_bound"][0, cb, o] == pytest.approx(1e10)


def test_written_all_atom_structures_read_back_with_ideal_geometry(tmp_path):
    """D6: PDB and mmCIF carry every heavy atom (atom37 order, pLDDT in each B-factor), gemmi and
    Biopython read them, and the side-chain bond lengths in the files are the ideal ones (the
    same for another set of torsions)."""
    import gemmi
    from Bio.PDB import MMCIFParser, PDBParser

    from protdp.data.residues import RESTYPES
    from protdp.inference.writers import write_structures

    aatype, frames, angles = _random_residues(n_copies=1, seed=6)
    seq = "".join(RESTYPES[int(a)] for a in aatype)
    _, _, x37 = _build(aatype, frames, angles)
    _, _, x37_other = _build(aatype, frames, torch.roll(angles, 3, dims=0))
    mask = atom37_exists(aatype)
    plddt = np.linspace(10, 95, len(seq))
    paths = write_structures(tmp_path, "all20", seq, x37.numpy(), plddt, mask.numpy())
    n_atoms = int(mask.sum())
    for kind, bio in (("pdb", PDBParser(QUIET=True)), ("cif", MMCIFParser(QUIET=True))):
        residues = list(bio.get_structure("x", str(paths[kind]))[0]["A"])
        g_residues = list(gemmi.read_structure(str(paths[kind]))[0]["A"])
        assert len(residues) == len(g_residues) == 20
        assert sum(len(r) for r in residues) == sum(len(r) for r in g_residues) == n_atoms
        for i, (r, g) in enumerate(zip(residues, g_residues)):
            name = rc.RESTYPE_3[int(aatype[i])]
            assert r.get_resname() == g.name == name
            assert [a.get_id() for a in r] == [a.name for a in g] == \
                [n for n in rc.ATOM_TYPES if n in rc.RESTYPE_ATOM14_NAMES[name]]
            assert all(abs(a.get_bfactor() - round(plddt[i], 2)) < 1e-6 for a in r)
            assert all(a.element.name == a.name[0] for a in g)
            for a in r:
                assert np.allclose(a.coord, x37[i, rc.ATOM_ORDER[a.get_id()]].numpy(), atol=6e-4)
            for a1, a2, _, _ in bond_lengths()[name]:
                if (name, a1, a2) in RING_CLOSURES or (name, a2, a1) in RING_CLOSURES:
                    continue
                ideal = (x37_other[i, rc.ATOM_ORDER[a1]] - x37_other[i, rc.ATOM_ORDER[a2]]).norm().item()
                assert (r[a1] - r[a2]) == pytest.approx(ideal, abs=2e-3), (name, a1, a2)
