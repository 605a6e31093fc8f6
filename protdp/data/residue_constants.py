"""Per-atom residue tables in AlphaFold's conventions (atom37 / atom14).

Source of the data: DeepMind AlphaFold v2.3.2, `alphafold/common/residue_constants.py`
(Apache-2.0), tables `atom_types` and `restype_name_to_atom14_names`; they describe the
heavy atoms of the 20 standard amino acids (PDB chemical component dictionary names) and are
taken here as data. Residue types are indexed in `protdp.data.residues.RESTYPES` order
(AF2 `restypes`), 20 = X/UNK, which has no atoms.

- atom37: one slot per heavy-atom name over all residue types (`ATOM_TYPES`), so every
  residue is a [37] row with a per-type existence mask (`RESTYPE_ATOM37_MASK`);
- atom14: the (at most 14) heavy atoms of one residue type in a compact per-type order
  (`RESTYPE_ATOM14_NAMES`), backbone N, CA, C, O first.
"""

from __future__ import annotations

import numpy as np

from protdp.data.residues import NUM_AATYPE, RESTYPES, THREE_TO_ONE

ATOM_TYPES = (
    "N", "CA", "C", "CB", "O", "CG", "CG1", "CG2", "OG", "OG1", "SG", "CD",
    "CD1", "CD2", "ND1", "ND2", "OD1", "OD2", "SD", "CE", "CE1", "CE2", "CE3",
    "NE", "NE1", "NE2", "OE1", "OE2", "CH2", "NH1", "NH2", "OH", "CZ", "CZ2",
    "CZ3", "NZ", "OXT",
)
ATOM_ORDER = {name: i for i, name in enumerate(ATOM_TYPES)}
NUM_ATOM37 = len(ATOM_TYPES)          # 37
NUM_ATOM14 = 14

ONE_TO_THREE = {one: three for three, one in THREE_TO_ONE.items()}
RESTYPE_3 = tuple(ONE_TO_THREE[aa] for aa in RESTYPES) + ("UNK",)   # [21] AF2 order + UNK

# heavy atoms of each residue type in atom14 order ('' = unused slot)
RESTYPE_ATOM14_NAMES = {
    "ALA": ("N", "CA", "C", "O", "CB"),
    "ARG": ("N", "CA", "C", "O", "CB", "CG", "CD", "NE", "CZ", "NH1", "NH2"),
    "ASN": ("N", "CA", "C", "O", "CB", "CG", "OD1", "ND2"),
    "ASP": ("N", "CA", "C", "O", "CB", "CG", "OD1", "OD2"),
    "CYS": ("N", "CA", "C", "O", "CB", "SG"),
    "GLN": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "NE2"),
    "GLU": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "OE2"),
    "GLY": ("N", "CA", "C", "O"),
    "HIS": ("N", "CA", "C", "O", "CB", "CG", "ND1", "CD2", "CE1", "NE2"),
    "ILE": ("N", "CA", "C", "O", "CB", "CG1", "CG2", "CD1"),
    "LEU": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2"),
    "LYS": ("N", "CA", "C", "O", "CB", "CG", "CD", "CE", "NZ"),
    "MET": ("N", "CA", "C", "O", "CB", "CG", "SD", "CE"),
    "PHE": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ"),
    "PRO": ("N", "CA", "C", "O", "CB", "CG", "CD"),
    "SER": ("N", "CA", "C", "O", "CB", "OG"),
    "THR": ("N", "CA", "C", "O", "CB", "OG1", "CG2"),
    "TRP": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "NE1", "CE2", "CE3", "CZ2", "CZ3",
            "CH2"),
    "TYR": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ", "OH"),
    "VAL": ("N", "CA", "C", "O", "CB", "CG1", "CG2"),
    "UNK": (),
}


def _atom37_mask() -> np.ndarray:
    mask = np.zeros((NUM_AATYPE, NUM_ATOM37), dtype=np.uint8)
    for r, name3 in enumerate(RESTYPE_3):
        for atom in RESTYPE_ATOM14_NAMES[name3]:
            mask[r, ATOM_ORDER[atom]] = 1
    return mask


RESTYPE_ATOM37_MASK = _atom37_mask()   # uint8 [21, 37]: 1 where the residue type has the atom
