"""Structural violation loss (AF2 supplement §1.9.11, Eq. 44-47; AF2 `between_residue_bond_loss`,
`between_residue_clash_loss`, `within_residue_violations`, `structural_violation_loss`).

Flat-bottom penalties on the predicted atom14 coordinates: the peptide bond C-N and the angles
CA-C-N / C-N-CA between consecutive residues, van der Waals clashes between residues, and
within-residue bond lengths / angles / clashes against literature bounds
(`residue_constants.atom14_distance_bounds`). Batched over leading dimensions [*].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from protdp.data import residue_constants as rc
from protdp.model.all_atom import residue_table

PRO_ID = rc.RESTYPES.index("P")
CYS_SG = rc.RESTYPE_ATOM14_NAMES["CYS"].index("SG")


def _dist(a, b, eps):
    return torch.sqrt(eps + ((a - b) ** 2).sum(-1))


def _flat_bottom(error, tolerance, mask):
    """mean over `mask` of relu(error - tolerance) -> [*], and the per-pair loss."""
    loss = F.relu(error - tolerance)
    return (mask * loss).sum(-1) / (mask.sum(-1) + 1e-6), loss


def between_residue_bond_loss(pos14, mask14, residue_index, aatype, tolerance: float = 12.0):
    """Eq. 44-45: peptide-bond length and angles between residue i and i+1 (AF2 keeps the bond
    length's stddev for the CA-C-N angle; so do we). -> (sum of the 3 means [*], per-residue
    loss [*, L])."""
    ca, c = pos14[..., :-1, 1, :], pos14[..., :-1, 2, :]
    n_next, ca_next = pos14[..., 1:, 0, :], pos14[..., 1:, 1, :]
    m_ca, m_c = mask14[..., :-1, 1], mask14[..., :-1, 2]
    m_n, m_ca_next = mask14[..., 1:, 0], mask14[..., 1:, 1]
    no_gap = ((residue_index[..., 1:] - residue_index[..., :-1]) == 1).to(pos14.dtype)
    next_pro = (aatype[..., 1:] == PRO_ID).to(pos14.dtype)

    c_n = _dist(c, n_next, 1e-6)
    length = torch.where(next_pro > 0, rc.BETWEEN_RES_BOND_LENGTH_C_N[1], rc.BETWEEN_RES_BOND_LENGTH_C_N[0])
    sd = torch.where(next_pro > 0, rc.BETWEEN_RES_BOND_LENGTH_STDDEV_C_N[1],
                     rc.BETWEEN_RES_BOND_LENGTH_STDDEV_C_N[0])
    c_n_mean, c_n_loss = _flat_bottom(torch.sqrt(1e-6 + (c_n - length) ** 2), tolerance * sd,
                                      m_c * m_n * no_gap)

    c_ca_unit = (ca - c) / _dist(ca, c, 1e-6)[..., None]
    c_n_unit = (n_next - c) / c_n[..., None]
    n_ca_unit = (ca_next - n_next) / _dist(ca_next, n_next, 1e-6)[..., None]
    cos_ca_c_n = (c_ca_unit * c_n_unit).sum(-1)
    ca_c_n_mean, ca_c_n_loss = _flat_bottom(
        torch.sqrt(1e-6 + (cos_ca_c_n - rc.BETWEEN_RES_COS_ANGLES_CA_C_N[0]) ** 2),
        tolerance * rc.BETWEEN_RES_BOND_LENGTH_STDDEV_C_N[0], m_ca * m_c * m_n * no_gap)
    cos_c_n_ca = (-c_n_unit * n_ca_unit).sum(-1)
    c_n_ca_mean, c_n_ca_loss = _flat_bottom(
        torch.sqrt(1e-6 + (cos_c_n_ca - rc.BETWEEN_RES_COS_ANGLES_C_N_CA[0]) ** 2),
        tolerance * rc.BETWEEN_RES_COS_ANGLES_C_N_CA[1], m_c * m_n * m_ca_next * no_gap)

    per_bond = c_n_loss + ca_c_n_loss + c_n_ca_loss                          # [*, L-1]
    per_residue = 0.5 * (F.pad(per_bond, (0, 1)) + F.pad(per_bond, (1, 0)))  # [*, L]
    return c_n_mean + ca_c_n_mean + c_n_ca_mean, per_residue


def between_residue_clash_loss(pos14, exists14, aatype, residue_index, tolerance: float = 1.5):
    """Eq. 46, pairs of atoms in different residues closer than the sum of their van der Waals
    radii minus `tolerance` (the peptide C-N bond and CYS SG-SG disulfides excepted)
    -> per-atom loss sum [*, L, 14]."""
    radius = residue_table(rc.RESTYPE_ATOM14_RADIUS, aatype, pos14.dtype) * exists14
    d = _dist(pos14[..., :, None, :, None, :], pos14[..., None, :, None, :, :], 1e-10)  # [*, L, L, 14, 14]
    ri = residue_index[..., :, None, None, None]
    rj = residue_index[..., None, :, None, None]
    mask = exists14[..., :, None, :, None] * exists14[..., None, :, None, :] * (ri < rj).to(d.dtype)
    c_n = torch.zeros(14, 14, dtype=d.dtype, device=d.device)
    c_n[2, 0] = 1.0                                                          # C of i, N of i+1
    mask = mask * (1.0 - ((ri + 1) == rj).to(d.dtype) * c_n)
    ss = torch.zeros(14, 14, dtype=d.dtype, device=d.device)
    ss[CYS_SG, CYS_SG] = 1.0
    mask = mask * (1.0 - ss)
    lower = mask * (radius[..., :, None, :, None] + radius[..., None, :, None, :])
    err = mask * F.relu(lower - tolerance - d)
    return err.sum((-3, -1)) + err.sum((-4, -2))                              # [*, L, 14]


def within_residue_loss(pos14, exists14, aatype, tolerance: float = 12.0, overlap: float = 1.5):
    """Eq. 46-47 within residues: distances outside the literature bounds -> [*, L, 14]."""
    bounds = rc.atom14_distance_bounds(overlap, tolerance)
    lower = residue_table(bounds["lower_bound"], aatype, pos14.dtype)          # [*, L, 14, 14]
    upper = residue_table(bounds["upper_bound"], aatype, pos14.dtype)
    eye = torch.eye(14, dtype=pos14.dtype, device=pos14.device)
    mask = (1.0 - eye) * exists14[..., :, None] * exists14[..., None, :]
    d = _dist(pos14[..., :, None, :], pos14[..., None, :, :], 1e-10)
    loss = mask * (F.relu(lower - d) + F.relu(d - upper))
    return loss.sum(-1) + loss.sum(-2)


def violation_loss(pos14, aatype, residue_index, seq_mask, tolerance: float = 12.0,
                   overlap: float = 1.5) -> torch.Tensor:
    """AF2 `structural_violation_loss`: the 3 peptide-bond means + (clash + within-residue
    per-atom sums) / number of atoms -> [*]. pos14 [*, L, 14, 3]."""
    exists14 = residue_table(rc.RESTYPE_ATOM14_MASK, aatype, pos14.dtype)
    exists14 = exists14 * seq_mask[..., None].to(pos14.dtype)
    bonds, _ = between_residue_bond_loss(pos14, exists14, residue_index, aatype, tolerance)
    clash = between_residue_clash_loss(pos14, exists14, aatype, residue_index, overlap)
    within = within_residue_loss(pos14, exists14, aatype, tolerance, overlap)
    n_atoms = exists14.sum((-1, -2))
    return bonds + (clash + within).sum((-1, -2)) / (1e-6 + n_atoms)
