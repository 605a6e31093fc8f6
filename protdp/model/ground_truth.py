"""Ground truth for the structure losses, from the batch's atom37 coordinates (AF2 supplement
§1.9; AF2 `atom37_to_frames`, `atom37_to_torsion_angles`, `make_atom14_positions`).

`all_atom_positions` [*, L, 37, 3] / `all_atom_mask` [*, L, 37] are the truth (docs/batch_format.md);
a batch with only the store-v1 backbone (`backbone_positions` [*, L, 5, 3] N, CA, C, O, CB)
is converted on the fly (glycine's virtual CB dropped). Padding (`seq_mask` 0) masks everything.
"""

from __future__ import annotations

from typing import Mapping

import torch

from protdp.data.residue_constants import BACKBONE_ATOM37_SLOTS, NUM_ATOM37
from protdp.model.all_atom import (alt_atom14, atom14_exists, atom14_is_ambiguous, atom37_exists,
                                   atom37_to_atom14, atom37_to_frames, atom37_to_torsion_angles,
                                   pseudo_beta)


def atom37_truth(batch: Mapping) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [*, L, 37, 3], mask [*, L, 37]) in float32 or wider, masked by the residue
    type's atoms and by `seq_mask`."""
    aatype = batch["aatype"]
    if "all_atom_positions" in batch:
        pos, mask = batch["all_atom_positions"], batch["all_atom_mask"]
        dtype = torch.promote_types(pos.dtype, torch.float32)
        pos, mask = pos.to(dtype), mask.to(dtype)
    else:
        bb, bb_mask = batch["backbone_positions"], batch["backbone_mask"]
        dtype = torch.promote_types(bb.dtype, torch.float32)
        pos = bb.new_zeros(bb.shape[:-2] + (NUM_ATOM37, 3), dtype=dtype)
        mask = bb.new_zeros(bb.shape[:-2] + (NUM_ATOM37,), dtype=dtype)
        pos[..., list(BACKBONE_ATOM37_SLOTS), :] = bb.to(dtype)
        mask[..., list(BACKBONE_ATOM37_SLOTS)] = bb_mask.to(dtype)
    mask = mask * atom37_exists(aatype, dtype) * batch["seq_mask"].to(dtype)[..., None]
    return pos * (mask[..., None] > 0), mask


def structure_truth(batch: Mapping) -> dict:
    """Everything the structure losses compare against, each with a leading [*, L]."""
    aatype = batch["aatype"]
    pos37, mask37 = atom37_truth(batch)
    pos14 = atom37_to_atom14(pos37, aatype)
    mask14 = atom37_to_atom14(mask37, aatype)
    alt14, alt_mask14 = alt_atom14(aatype, pos14, mask14)
    frames = atom37_to_frames(aatype, pos37, mask37)
    torsions = atom37_to_torsion_angles(aatype, pos37, mask37)
    cb, cb_mask = pseudo_beta(aatype, pos37, mask37)
    return {
        "atom37": pos37, "atom37_mask": mask37,                            # [*, L, 37(, 3)]
        "atom14": pos14, "atom14_mask": mask14,                            # [*, L, 14(, 3)]
        "atom14_alt": alt14, "atom14_alt_mask": alt_mask14,
        "atom14_exists": atom14_exists(aatype, pos37.dtype),
        "atom14_ambiguous": atom14_is_ambiguous(aatype, pos37.dtype),
        "frames": frames["frames"], "alt_frames": frames["alt_frames"],    # Rigid [*, L, 8]
        "frames_mask": frames["gt_exists"],                                # [*, L, 8]
        "backbone_mask": frames["gt_exists"][..., 0],                      # N, CA, C present
        "chi_sin_cos": torsions["sin_cos"][..., 3:, :],                    # [*, L, 4, 2]
        "chi_mask": torsions["mask"][..., 3:],
        "pseudo_beta": cb, "pseudo_beta_mask": cb_mask,                    # [*, L, 3] / [*, L]
    }
