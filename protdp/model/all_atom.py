"""All-atom geometry in torch (AF2 supplement §1.8.4-1.8.5, Alg. 24-25, Table 2), differentiable.

- `torsion_angles_to_frames`: backbone frames + the 7 torsions (omega, phi, psi, chi1-4) ->
  the 8 rigid-group frames of every residue (Alg. 24 lines 1-10, Alg. 25 makeRotX).
- `frames_to_atom14`: literature atom positions placed by their group's frame (Alg. 24 line 11).
- `atom14_to_atom37` / `atom37_to_atom14`: the two per-residue atom layouts.
- `atom37_to_frames` / `atom37_to_torsion_angles`: the inverse direction for ground truth
  (rigid-group frames with the 180-degree alternatives of ambiguous groups; torsions with the
  pi-shifted alternatives of pi-periodic chis), as AF2's `all_atom` computes them.
- `alt_atom14`: ground truth with the symmetric atoms swapped (Alg. 26 inputs).

Residue types index the tables of `protdp.data.residue_constants`; values >= 20 count as X
(no atoms). Leading dimensions [*] are free; L is the residue axis.
"""

from __future__ import annotations

import numpy as np
import torch

from protdp.data import residue_constants as rc
from protdp.data.residues import UNK_ID
from protdp.model.rigid import Rigid, rot_x

# torsion index of psi, whose sign AF2 flips (it is measured from O, not from the next N)
PSI = 2


def residue_table(table: np.ndarray, aatype: torch.Tensor, dtype=None) -> torch.Tensor:
    """Per-residue-type table [21, ...] gathered at aatype [*] -> [*, ...]."""
    t = torch.as_tensor(table, device=aatype.device)
    if dtype is not None:
        t = t.to(dtype)
    return t[aatype.long().clamp(0, UNK_ID)]


def atom14_exists(aatype: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[*, L] -> [*, L, 14] 1 where the residue type has that atom14 atom."""
    return residue_table(rc.RESTYPE_ATOM14_MASK, aatype, dtype)


def atom37_exists(aatype: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[*, L] -> [*, L, 37] 1 where the residue type has that atom37 atom."""
    return residue_table(rc.RESTYPE_ATOM37_MASK, aatype, dtype)


def _gather_atoms(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [*, L, A, ...] gathered along the atom axis with index [*, L, B] -> [*, L, B, ...]."""
    extra = values.dim() - index.dim()
    idx = index.reshape(index.shape + (1,) * extra).expand(index.shape + values.shape[index.dim():])
    return torch.gather(values, index.dim() - 1, idx)


def atom14_to_atom37(x14: torch.Tensor, aatype: torch.Tensor) -> torch.Tensor:
    """[*, L, 14, ...] -> [*, L, 37, ...], zero where the residue type lacks the atom."""
    x37 = _gather_atoms(x14, residue_table(rc.RESTYPE_ATOM37_TO_ATOM14, aatype))
    mask = atom37_exists(aatype, x14.dtype)
    return x37 * mask.reshape(mask.shape + (1,) * (x14.dim() - mask.dim()))


def atom37_to_atom14(x37: torch.Tensor, aatype: torch.Tensor) -> torch.Tensor:
    """[*, L, 37, ...] -> [*, L, 14, ...], zero in unused atom14 slots."""
    x14 = _gather_atoms(x37, residue_table(rc.RESTYPE_ATOM14_TO_ATOM37, aatype))
    mask = atom14_exists(aatype, x37.dtype)
    return x14 * mask.reshape(mask.shape + (1,) * (x37.dim() - mask.dim()))


def torsion_angles_to_frames(aatype: torch.Tensor, backbone: Rigid, angles: torch.Tensor) -> Rigid:
    """Algorithm 24 lines 1-10: aatype [*, L], backbone frames [*, L] (Å), angles (sin, cos)
    [*, L, 7, 2] -> the 8 rigid-group frames in the global frame [*, L, 8]."""
    default = Rigid.from_tensor_4x4(residue_table(rc.RESTYPE_RIGID_GROUP_DEFAULT_FRAME, aatype,
                                                  angles.dtype))              # [*, L, 8]
    backbone_angle = torch.stack([torch.zeros_like(angles[..., 0, 0]),
                                  torch.ones_like(angles[..., 0, 1])], dim=-1)  # (sin 0, cos 0)
    angles8 = torch.cat([backbone_angle[..., None, :], angles], dim=-2)      # [*, L, 8, 2]
    local = default.compose_rot(rot_x(angles8))                              # group -> parent
    chi1 = local.index((..., 4))
    chi2 = chi1.compose(local.index((..., 5)))      # chi2..4 hang off the previous chi frame
    chi3 = chi2.compose(local.index((..., 6)))
    chi4 = chi3.compose(local.index((..., 7)))
    to_backbone = Rigid.cat([local.index((..., slice(0, 5))), chi2.unsqueeze(-1), chi3.unsqueeze(-1),
                             chi4.unsqueeze(-1)], dim=-1)                      # [*, L, 8]
    return backbone.unsqueeze(-1).compose(to_backbone)


def frames_to_atom14(aatype: torch.Tensor, frames: Rigid) -> torch.Tensor:
    """Algorithm 24 line 11: group frames [*, L, 8] -> atom14 positions [*, L, 14, 3] (zero in
    unused slots), each atom at its literature position in its rigid group's frame."""
    group = residue_table(rc.RESTYPE_ATOM14_TO_RIGID_GROUP, aatype)          # [*, L, 14]
    rot = _gather_atoms(frames.rot, group)                                   # [*, L, 14, 3, 3]
    trans = _gather_atoms(frames.trans, group)                               # [*, L, 14, 3]
    lit = residue_table(rc.RESTYPE_ATOM14_RIGID_GROUP_POSITIONS, aatype, frames.trans.dtype)
    pos = Rigid(rot, trans).apply(lit)
    return pos * atom14_exists(aatype, pos.dtype)[..., None]


def pseudo_beta(aatype: torch.Tensor, positions37: torch.Tensor, mask37: torch.Tensor | None = None):
    """CB (CA for glycine) [*, L, 3] from atom37 positions, and its mask [*, L] if a mask is given."""
    is_gly = (aatype == rc.RESTYPES.index("G"))
    ca, cb = rc.ATOM_ORDER["CA"], rc.ATOM_ORDER["CB"]
    pos = torch.where(is_gly[..., None], positions37[..., ca, :], positions37[..., cb, :])
    if mask37 is None:
        return pos
    return pos, torch.where(is_gly, mask37[..., ca], mask37[..., cb])


def atom37_to_frames(aatype: torch.Tensor, positions37: torch.Tensor, mask37: torch.Tensor) -> dict:
    """Ground-truth rigid-group frames (AF2 `atom37_to_frames`, Table 2): aatype [*, L],
    positions [*, L, 37, 3], mask [*, L, 37] -> frames / alt_frames [*, L, 8] (Rigid),
    gt_exists, group_exists, is_ambiguous [*, L, 8]."""
    base = residue_table(rc.RIGID_GROUP_BASE_ATOM37, aatype)                 # [*, L, 8, 3]
    flat = base.flatten(-2)                                                  # [*, L, 24]
    pts = _gather_atoms(positions37, flat).unflatten(-2, base.shape[-2:])    # [*, L, 8, 3, 3]
    frames = Rigid.from_3_points_neg_x(pts[..., 0, :], pts[..., 1, :], pts[..., 2, :])
    # the backbone group is built from (C, CA, N): mirror x and z to AF2's backbone convention
    mirror = torch.ones(8, 3, dtype=positions37.dtype, device=positions37.device)
    mirror[0, 0] = mirror[0, 2] = -1.0
    frames = Rigid(frames.rot * mirror[:, None, :], frames.trans)
    group_exists = residue_table(rc.RESTYPE_RIGID_GROUP_MASK, aatype, mask37.dtype)
    atoms_exist = _gather_atoms(mask37, flat).unflatten(-1, base.shape[-2:])  # [*, L, 8, 3]
    gt_exists = atoms_exist.amin(-1) * group_exists
    alt_rot = residue_table(rc.RESTYPE_RIGID_GROUP_AMBIGUITY_ROT, aatype, positions37.dtype)
    return {"frames": frames, "alt_frames": frames.compose_rot(alt_rot),
            "gt_exists": gt_exists, "group_exists": group_exists,
            "is_ambiguous": residue_table(rc.RESTYPE_RIGID_GROUP_IS_AMBIGUOUS, aatype, mask37.dtype)}


def _torsion_atoms(aatype: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor):
    """The 4 atoms [*, L, 7, 4, 3] defining each torsion and the torsion mask [*, L, 7]."""
    prev_pos = torch.cat([torch.zeros_like(pos[..., :1, :, :]), pos[..., :-1, :, :]], dim=-3)
    prev_mask = torch.cat([torch.zeros_like(mask[..., :1, :]), mask[..., :-1, :]], dim=-2)
    omega = torch.cat([prev_pos[..., 1:3, :], pos[..., 0:2, :]], dim=-2)     # CA-, C-, N, CA
    phi = torch.cat([prev_pos[..., 2:3, :], pos[..., 0:3, :]], dim=-2)       # C-, N, CA, C
    psi = torch.cat([pos[..., 0:3, :], pos[..., 4:5, :]], dim=-2)            # N, CA, C, O
    omega_mask = prev_mask[..., 1:3].prod(-1) * mask[..., 0:2].prod(-1)
    phi_mask = prev_mask[..., 2] * mask[..., 0:3].prod(-1)
    psi_mask = mask[..., 0:3].prod(-1) * mask[..., 4]
    chi_idx = residue_table(rc.CHI_ATOM_INDICES, aatype)                     # [*, L, 4, 4]
    chi_pos = _gather_atoms(pos, chi_idx.flatten(-2)).unflatten(-2, (4, 4))
    chi_atoms_mask = _gather_atoms(mask, chi_idx.flatten(-2)).unflatten(-1, (4, 4)).prod(-1)
    chi_mask = residue_table(rc.CHI_ANGLES_MASK, aatype, mask.dtype) * chi_atoms_mask
    atoms = torch.cat([omega[..., None, :, :], phi[..., None, :, :], psi[..., None, :, :], chi_pos],
                      dim=-3)
    tmask = torch.cat([omega_mask[..., None], phi_mask[..., None], psi_mask[..., None], chi_mask],
                      dim=-1)
    return atoms, tmask


def atom37_to_torsion_angles(aatype: torch.Tensor, positions37: torch.Tensor,
                             mask37: torch.Tensor) -> dict:
    """The 7 torsions (AF2 `atom37_to_torsion_angles`): aatype [*, L], positions [*, L, 37, 3],
    mask [*, L, 37] -> sin_cos and alt_sin_cos (pi-periodic chis shifted by pi) [*, L, 7, 2],
    mask [*, L, 7]. Residue i's omega and phi use residue i-1 (masked at the first residue)."""
    atoms, tmask = _torsion_atoms(aatype, positions37, mask37)
    frame = Rigid.from_3_points_neg_x(atoms[..., 1, :], atoms[..., 2, :], atoms[..., 0, :])
    fourth = frame.invert_apply(atoms[..., 3, :])                            # [*, L, 7, 3]
    sin_cos = torch.stack([fourth[..., 2], fourth[..., 1]], dim=-1)
    sin_cos = sin_cos / torch.sqrt((sin_cos ** 2).sum(-1, keepdim=True) + 1e-8)
    flip = torch.ones(7, dtype=sin_cos.dtype, device=sin_cos.device)
    flip[PSI] = -1.0                                                         # psi measured via O
    sin_cos = sin_cos * flip[:, None]
    periodic = residue_table(rc.CHI_PI_PERIODIC, aatype, sin_cos.dtype)     # [*, L, 4]
    shift = torch.cat([torch.ones_like(periodic[..., :3]), 1.0 - 2.0 * periodic], dim=-1)
    return {"sin_cos": sin_cos, "alt_sin_cos": sin_cos * shift[..., None], "mask": tmask}


def alt_atom14(aatype: torch.Tensor, positions14: torch.Tensor, mask14: torch.Tensor):
    """Ground truth with the symmetric atom pairs of ASP/GLU/PHE/TYR swapped (Alg. 26):
    positions [*, L, 14, 3], mask [*, L, 14] -> (alt positions, alt mask)."""
    swap = residue_table(rc.RESTYPE_ATOM14_SWAP, aatype)                     # [*, L, 14]
    return _gather_atoms(positions14, swap), _gather_atoms(mask14, swap)


def atom14_is_ambiguous(aatype: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[*, L] -> [*, L, 14] 1 for atoms whose name is ambiguous by symmetry."""
    return residue_table(rc.RESTYPE_ATOM14_IS_AMBIGUOUS, aatype, dtype)
