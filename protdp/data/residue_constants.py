"""Per-atom residue tables in AlphaFold's conventions (atom37 / atom14, rigid groups, torsions).

Source of the data: DeepMind AlphaFold v2.3.2, `alphafold/common/residue_constants.py`
(Apache-2.0): `atom_types`, `restype_name_to_atom14_names`, `rigid_group_atom_positions`,
`chi_angles_atoms`, `chi_angles_mask`, `chi_pi_periodic`, `residue_atom_renaming_swaps`,
`van_der_waals_radius` and the between-residue bond constants. They describe the heavy atoms of
the 20 standard amino acids (PDB chemical component dictionary names; idealised positions from
the literature geometry AF2 used) and are taken here as data. The bond-length / bond-angle
statistics live in `protdp.data.stereo_chemical_props` (Engh & Huber via OpenStructure).
Residue types are indexed in `protdp.data.residues.RESTYPES` order (AF2 `restypes`),
20 = X/UNK, which has no atoms.

- atom37: one slot per heavy-atom name over all residue types (`ATOM_TYPES`), so every
  residue is a [37] row with a per-type existence mask (`RESTYPE_ATOM37_MASK`);
- atom14: the (at most 14) heavy atoms of one residue type in a compact per-type order
  (`RESTYPE_ATOM14_NAMES`), backbone N, CA, C, O first;
- rigid groups (AF2 supplement Table 2): 0 backbone, 1 pre-omega, 2 phi, 3 psi, 4-7 chi1-chi4;
  every atom sits at a fixed literature position in one group's frame, and the 7 torsions
  (omega, phi, psi, chi1-4) rotate the groups about their x axes (Alg. 24).

The derived numpy tables below (`RESTYPE_*`, `CHI_ATOM_INDICES`, ...) are computed once at import
from those data, exactly as AF2 computes them (float32, like AF2's own arrays).
"""

from __future__ import annotations

import functools

import numpy as np

from protdp.data.residues import BACKBONE_ATOMS, NUM_AATYPE, RESTYPES, THREE_TO_ONE, UNK_ID

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

# atom37 slots of the store-v1 backbone atoms N, CA, C, O, CB (`residues.BACKBONE_ATOMS`)
BACKBONE_ATOM37_SLOTS = tuple(ATOM_ORDER[a] for a in BACKBONE_ATOMS)   # (0, 1, 2, 4, 3)

# Literature atom positions in their rigid group's frame: (atom, group, (x, y, z) in Å). The
# x axis is the group's rotation axis; the atom defining the torsion lies in the xy plane, y > 0.
RIGID_GROUP_ATOM_POSITIONS = {
    "ALA": (
        ("N", 0, (-0.525, 1.363, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, 0.000, 0.000)),
        ("CB", 0, (-0.529, -0.774, -1.205)),
        ("O", 3, (0.627, 1.062, 0.000)),
    ),
    "ARG": (
        ("N", 0, (-0.524, 1.362, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, 0.000, 0.000)),
        ("CB", 0, (-0.524, -0.778, -1.209)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG", 4, (0.616, 1.390, 0.000)),
        ("CD", 5, (0.564, 1.414, 0.000)),
        ("NE", 6, (0.539, 1.357, 0.000)),
        ("NH1", 7, (0.206, 2.301, 0.000)),
        ("NH2", 7, (2.078, 0.978, 0.000)),
        ("CZ", 7, (0.758, 1.093, 0.000)),
    ),
    "ASN": (
        ("N", 0, (-0.536, 1.357, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, 0.000, 0.000)),
        ("CB", 0, (-0.531, -0.787, -1.200)),
        ("O", 3, (0.625, 1.062, 0.000)),
        ("CG", 4, (0.584, 1.399, 0.000)),
        ("ND2", 5, (0.593, -1.188, 0.001)),
        ("OD1", 5, (0.633, 1.059, 0.000)),
    ),
    "ASP": (
        ("N", 0, (-0.525, 1.362, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.527, 0.000, 0.000)),
        ("CB", 0, (-0.526, -0.778, -1.208)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG", 4, (0.593, 1.398, 0.000)),
        ("OD1", 5, (0.610, 1.091, 0.000)),
        ("OD2", 5, (0.592, -1.101, -0.003)),
    ),
    "CYS": (
        ("N", 0, (-0.522, 1.362, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.524, 0.000, 0.000)),
        ("CB", 0, (-0.519, -0.773, -1.212)),
        ("O", 3, (0.625, 1.062, 0.000)),
        ("SG", 4, (0.728, 1.653, 0.000)),
    ),
    "GLN": (
        ("N", 0, (-0.526, 1.361, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, 0.000, 0.000)),
        ("CB", 0, (-0.525, -0.779, -1.207)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG", 4, (0.615, 1.393, 0.000)),
        ("CD", 5, (0.587, 1.399, 0.000)),
        ("NE2", 6, (0.593, -1.189, -0.001)),
        ("OE1", 6, (0.634, 1.060, 0.000)),
    ),
    "GLU": (
        ("N", 0, (-0.528, 1.361, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, 0.000, 0.000)),
        ("CB", 0, (-0.526, -0.781, -1.207)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG", 4, (0.615, 1.392, 0.000)),
        ("CD", 5, (0.600, 1.397, 0.000)),
        ("OE1", 6, (0.607, 1.095, 0.000)),
        ("OE2", 6, (0.589, -1.104, -0.001)),
    ),
    "GLY": (
        ("N", 0, (-0.572, 1.337, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.517, 0.000, 0.000)),
        ("O", 3, (0.626, 1.062, 0.000)),
    ),
    "HIS": (
        ("N", 0, (-0.527, 1.360, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, 0.000, 0.000)),
        ("CB", 0, (-0.525, -0.778, -1.208)),
        ("O", 3, (0.625, 1.063, 0.000)),
        ("CG", 4, (0.600, 1.370, 0.000)),
        ("CD2", 5, (0.889, -1.021, 0.003)),
        ("ND1", 5, (0.744, 1.160, 0.000)),
        ("CE1", 5, (2.030, 0.851, 0.002)),
        ("NE2", 5, (2.145, -0.466, 0.004)),
    ),
    "ILE": (
        ("N", 0, (-0.493, 1.373, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.527, 0.000, 0.000)),
        ("CB", 0, (-0.536, -0.793, -1.213)),
        ("O", 3, (0.627, 1.062, 0.000)),
        ("CG1", 4, (0.534, 1.437, 0.000)),
        ("CG2", 4, (0.540, -0.785, -1.199)),
        ("CD1", 5, (0.619, 1.391, 0.000)),
    ),
    "LEU": (
        ("N", 0, (-0.520, 1.363, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, 0.000, 0.000)),
        ("CB", 0, (-0.522, -0.773, -1.214)),
        ("O", 3, (0.625, 1.063, 0.000)),
        ("CG", 4, (0.678, 1.371, 0.000)),
        ("CD1", 5, (0.530, 1.430, 0.000)),
        ("CD2", 5, (0.535, -0.774, 1.200)),
    ),
    "LYS": (
        ("N", 0, (-0.526, 1.362, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, 0.000, 0.000)),
        ("CB", 0, (-0.524, -0.778, -1.208)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG", 4, (0.619, 1.390, 0.000)),
        ("CD", 5, (0.559, 1.417, 0.000)),
        ("CE", 6, (0.560, 1.416, 0.000)),
        ("NZ", 7, (0.554, 1.387, 0.000)),
    ),
    "MET": (
        ("N", 0, (-0.521, 1.364, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, 0.000, 0.000)),
        ("CB", 0, (-0.523, -0.776, -1.210)),
        ("O", 3, (0.625, 1.062, 0.000)),
        ("CG", 4, (0.613, 1.391, 0.000)),
        ("SD", 5, (0.703, 1.695, 0.000)),
        ("CE", 6, (0.320, 1.786, 0.000)),
    ),
    "PHE": (
        ("N", 0, (-0.518, 1.363, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.524, 0.000, 0.000)),
        ("CB", 0, (-0.525, -0.776, -1.212)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG", 4, (0.607, 1.377, 0.000)),
        ("CD1", 5, (0.709, 1.195, 0.000)),
        ("CD2", 5, (0.706, -1.196, 0.000)),
        ("CE1", 5, (2.102, 1.198, 0.000)),
        ("CE2", 5, (2.098, -1.201, 0.000)),
        ("CZ", 5, (2.794, -0.003, -0.001)),
    ),
    "PRO": (
        ("N", 0, (-0.566, 1.351, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.527, 0.000, 0.000)),
        ("CB", 0, (-0.546, -0.611, -1.293)),
        ("O", 3, (0.621, 1.066, 0.000)),
        ("CG", 4, (0.382, 1.445, 0.000)),
        ("CD", 5, (0.477, 1.424, 0.000)),
    ),
    "SER": (
        ("N", 0, (-0.529, 1.360, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, 0.000, 0.000)),
        ("CB", 0, (-0.518, -0.777, -1.211)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("OG", 4, (0.503, 1.325, 0.000)),
    ),
    "THR": (
        ("N", 0, (-0.517, 1.364, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.526, 0.000, 0.000)),
        ("CB", 0, (-0.516, -0.793, -1.215)),
        ("O", 3, (0.626, 1.062, 0.000)),
        ("CG2", 4, (0.550, -0.718, -1.228)),
        ("OG1", 4, (0.472, 1.353, 0.000)),
    ),
    "TRP": (
        ("N", 0, (-0.521, 1.363, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.525, 0.000, 0.000)),
        ("CB", 0, (-0.523, -0.776, -1.212)),
        ("O", 3, (0.627, 1.062, 0.000)),
        ("CG", 4, (0.609, 1.370, 0.000)),
        ("CD1", 5, (0.824, 1.091, 0.000)),
        ("CD2", 5, (0.854, -1.148, -0.005)),
        ("CE2", 5, (2.186, -0.678, -0.007)),
        ("CE3", 5, (0.622, -2.530, -0.007)),
        ("NE1", 5, (2.140, 0.690, -0.004)),
        ("CH2", 5, (3.028, -2.890, -0.013)),
        ("CZ2", 5, (3.283, -1.543, -0.011)),
        ("CZ3", 5, (1.715, -3.389, -0.011)),
    ),
    "TYR": (
        ("N", 0, (-0.522, 1.362, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.524, 0.000, 0.000)),
        ("CB", 0, (-0.522, -0.776, -1.213)),
        ("O", 3, (0.627, 1.062, 0.000)),
        ("CG", 4, (0.607, 1.382, 0.000)),
        ("CD1", 5, (0.716, 1.195, 0.000)),
        ("CD2", 5, (0.713, -1.194, -0.001)),
        ("CE1", 5, (2.107, 1.200, -0.002)),
        ("CE2", 5, (2.104, -1.201, -0.003)),
        ("OH", 5, (4.168, -0.002, -0.005)),
        ("CZ", 5, (2.791, -0.001, -0.003)),
    ),
    "VAL": (
        ("N", 0, (-0.494, 1.373, 0.000)),
        ("CA", 0, (0.000, 0.000, 0.000)),
        ("C", 0, (1.527, 0.000, 0.000)),
        ("CB", 0, (-0.533, -0.795, -1.213)),
        ("O", 3, (0.627, 1.062, 0.000)),
        ("CG1", 4, (0.540, 1.429, 0.000)),
        ("CG2", 4, (0.533, -0.776, 1.203)),
    ),
}

# Atoms defining chi1..chi4 (the last atom moves with the angle).
CHI_ANGLES_ATOMS = {
    "ALA": (),
    "ARG": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD"), ("CB", "CG", "CD", "NE"),
            ("CG", "CD", "NE", "CZ")),
    "ASN": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "OD1")),
    "ASP": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "OD1")),
    "CYS": (("N", "CA", "CB", "SG"),),
    "GLN": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD"), ("CB", "CG", "CD", "OE1")),
    "GLU": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD"), ("CB", "CG", "CD", "OE1")),
    "GLY": (),
    "HIS": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "ND1")),
    "ILE": (("N", "CA", "CB", "CG1"), ("CA", "CB", "CG1", "CD1")),
    "LEU": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD1")),
    "LYS": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD"), ("CB", "CG", "CD", "CE"),
            ("CG", "CD", "CE", "NZ")),
    "MET": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "SD"), ("CB", "CG", "SD", "CE")),
    "PHE": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD1")),
    "PRO": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD")),
    "SER": (("N", "CA", "CB", "OG"),),
    "THR": (("N", "CA", "CB", "OG1"),),
    "TRP": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD1")),
    "TYR": (("N", "CA", "CB", "CG"), ("CA", "CB", "CG", "CD1")),
    "VAL": (("N", "CA", "CB", "CG1"),),
}

NUM_RIGID_GROUPS = 8                  # backbone, pre-omega, phi, psi, chi1..chi4 (Table 2)
NUM_TORSIONS = 7                      # omega, phi, psi, chi1..chi4 (Alg. 20 line 11)
NUM_CHIS = 4

# chi1..chi4 defined per residue type (AF2 restype order + UNK); 1 where the angle exists
CHI_ANGLES_MASK = np.array([
    [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0],   # A R N D C
    [1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0],   # Q E G H I
    [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0],   # L K M F P
    [1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0],   # S T W Y V
    [0, 0, 0, 0],                                                           # X
], dtype=np.float32)

# chi angles that are pi-periodic (a symmetric end group: ASP chi2, GLU chi3, PHE/TYR chi2)
CHI_PI_PERIODIC = np.zeros((NUM_AATYPE, NUM_CHIS), dtype=np.float32)
for _res, _chi in (("D", 1), ("E", 2), ("F", 1), ("Y", 1)):
    CHI_PI_PERIODIC[RESTYPES.index(_res), _chi] = 1.0

# atom-name swaps of the 4 residue types whose naming is ambiguous by symmetry (Alg. 26)
RESIDUE_ATOM_RENAMING_SWAPS = {
    "ASP": {"OD1": "OD2"},
    "GLU": {"OE1": "OE2"},
    "PHE": {"CD1": "CD2", "CE1": "CE2"},
    "TYR": {"CD1": "CD2", "CE1": "CE2"},
}

# van der Waals radii (Å) by element, the first letter of the atom name (AF2: from Wikipedia)
VAN_DER_WAALS_RADIUS = {"C": 1.7, "N": 1.55, "O": 1.52, "S": 1.8}

# peptide bond C(i)-N(i+1): (general, proline) length and stddev (Å); cosines of the angles
# CA-C-N and C-N-CA across the bond: (mean, stddev) (AF2 `between_res_*`, §1.9.11)
BETWEEN_RES_BOND_LENGTH_C_N = (1.329, 1.341)
BETWEEN_RES_BOND_LENGTH_STDDEV_C_N = (0.014, 0.016)
BETWEEN_RES_COS_ANGLES_C_N_CA = (-0.5203, 0.0353)     # 121.352 +- 2.315 degrees
BETWEEN_RES_COS_ANGLES_CA_C_N = (-0.4473, 0.0311)     # 116.568 +- 1.995 degrees


# ----------------------------------------------------------------------------- derived tables
def _atom14_index_tables():
    """atom14 <-> atom37 gather indices and the atom14 existence mask, per residue type."""
    to37 = np.zeros((NUM_AATYPE, NUM_ATOM14), dtype=np.int64)
    to14 = np.zeros((NUM_AATYPE, NUM_ATOM37), dtype=np.int64)
    mask14 = np.zeros((NUM_AATYPE, NUM_ATOM14), dtype=np.float32)
    for r, name3 in enumerate(RESTYPE_3):
        for i, atom in enumerate(RESTYPE_ATOM14_NAMES[name3]):
            to37[r, i] = ATOM_ORDER[atom]
            to14[r, ATOM_ORDER[atom]] = i
            mask14[r, i] = 1.0
    return to37, to14, mask14


RESTYPE_ATOM14_TO_ATOM37, RESTYPE_ATOM37_TO_ATOM14, RESTYPE_ATOM14_MASK = _atom14_index_tables()


def _rigid_4x4(ex, ey, translation) -> np.ndarray:
    """4x4 frame with x along ex, ey in the xy plane (Gram-Schmidt), origin `translation`."""
    ex = ex / np.linalg.norm(ex)
    ey = ey - np.dot(ey, ex) * ex
    ey = ey / np.linalg.norm(ey)
    m = np.stack([ex, ey, np.cross(ex, ey), translation]).T
    return np.concatenate([m, [[0.0, 0.0, 0.0, 1.0]]], axis=0)


def _rigid_group_tables():
    """Per residue type: each atom14 atom's group and literature position in that group's frame,
    and each group's default frame relative to its parent (AF2 `_make_rigid_group_constants`)."""
    group14 = np.zeros((NUM_AATYPE, NUM_ATOM14), dtype=np.int64)
    pos14 = np.zeros((NUM_AATYPE, NUM_ATOM14, 3), dtype=np.float32)
    frames = np.zeros((NUM_AATYPE, NUM_RIGID_GROUPS, 4, 4), dtype=np.float32)
    frames[:] = np.eye(4, dtype=np.float32)   # UNK and absent groups: identity (AF2 has zeros
    # for UNK; its atoms are all masked, so the choice never reaches an output)
    for r, name3 in enumerate(RESTYPE_3[:-1]):
        names14 = RESTYPE_ATOM14_NAMES[name3]
        pos = {}
        for atom, group, xyz in RIGID_GROUP_ATOM_POSITIONS[name3]:
            i = names14.index(atom)
            group14[r, i], pos14[r, i] = group, xyz
            pos[atom] = np.array(xyz, dtype=np.float64)
        frames[r, 2] = _rigid_4x4(pos["N"] - pos["CA"], np.array([1.0, 0.0, 0.0]), pos["N"])
        frames[r, 3] = _rigid_4x4(pos["C"] - pos["CA"], pos["CA"] - pos["N"], pos["C"])
        chis = CHI_ANGLES_ATOMS[name3]
        if chis:
            a = [pos[n] for n in chis[0]]
            frames[r, 4] = _rigid_4x4(a[2] - a[1], a[0] - a[1], a[2])
        for k in range(1, len(chis)):    # chi_k+1 frame in the chi_k frame: axis from its origin
            end = pos[chis[k][2]]
            frames[r, 4 + k] = _rigid_4x4(end, np.array([-1.0, 0.0, 0.0]), end)
    return group14, pos14, frames


(RESTYPE_ATOM14_TO_RIGID_GROUP, RESTYPE_ATOM14_RIGID_GROUP_POSITIONS,
 RESTYPE_RIGID_GROUP_DEFAULT_FRAME) = _rigid_group_tables()


def _chi_atom_indices() -> np.ndarray:
    """[21, 4 chis, 4 atoms] atom37 indices of the atoms defining each chi (0 if undefined)."""
    out = np.zeros((NUM_AATYPE, NUM_CHIS, 4), dtype=np.int64)
    for r, name3 in enumerate(RESTYPE_3[:-1]):
        for k, atoms in enumerate(CHI_ANGLES_ATOMS[name3]):
            out[r, k] = [ATOM_ORDER[a] for a in atoms]
    return out


CHI_ATOM_INDICES = _chi_atom_indices()


def _rigid_group_base_tables():
    """The 3 atoms (atom37 indices) whose positions define each rigid group's frame
    (point on -x, origin, point in the xy plane), the group existence mask, and the ambiguity of
    the last chi group of ASP/GLU/PHE/TYR (alternative frame: rotated 180 degrees about x)."""
    base = np.zeros((NUM_AATYPE, NUM_RIGID_GROUPS, 3), dtype=np.int64)
    exists = np.zeros((NUM_AATYPE, NUM_RIGID_GROUPS), dtype=np.float32)
    ambiguous = np.zeros((NUM_AATYPE, NUM_RIGID_GROUPS), dtype=np.float32)
    alt_rot = np.tile(np.eye(3, dtype=np.float32), (NUM_AATYPE, NUM_RIGID_GROUPS, 1, 1))
    base[:, 0] = [ATOM_ORDER["C"], ATOM_ORDER["CA"], ATOM_ORDER["N"]]
    base[:, 3] = [ATOM_ORDER["CA"], ATOM_ORDER["C"], ATOM_ORDER["O"]]
    exists[:, 0] = exists[:, 3] = 1.0
    for r, name3 in enumerate(RESTYPE_3[:-1]):
        for k, atoms in enumerate(CHI_ANGLES_ATOMS[name3]):
            base[r, 4 + k] = [ATOM_ORDER[a] for a in atoms[1:]]
            exists[r, 4 + k] = 1.0
        if name3 in RESIDUE_ATOM_RENAMING_SWAPS:
            last = 4 + len(CHI_ANGLES_ATOMS[name3]) - 1
            ambiguous[r, last] = 1.0
            alt_rot[r, last, 1, 1] = alt_rot[r, last, 2, 2] = -1.0
    return base, exists, ambiguous, alt_rot


(RIGID_GROUP_BASE_ATOM37, RESTYPE_RIGID_GROUP_MASK, RESTYPE_RIGID_GROUP_IS_AMBIGUOUS,
 RESTYPE_RIGID_GROUP_AMBIGUITY_ROT) = _rigid_group_base_tables()


def _atom14_ambiguity_tables():
    """[21, 14] 1 for atoms affected by a renaming swap, and [21, 14] the atom14 index each atom
    takes under the swap (identity elsewhere)."""
    ambiguous = np.zeros((NUM_AATYPE, NUM_ATOM14), dtype=np.float32)
    swap = np.tile(np.arange(NUM_ATOM14), (NUM_AATYPE, 1))
    for name3, pairs in RESIDUE_ATOM_RENAMING_SWAPS.items():
        r, names = RESTYPE_3.index(name3), RESTYPE_ATOM14_NAMES[name3]
        for a, b in pairs.items():
            i, j = names.index(a), names.index(b)
            ambiguous[r, i] = ambiguous[r, j] = 1.0
            swap[r, i], swap[r, j] = j, i
    return ambiguous, swap


RESTYPE_ATOM14_IS_AMBIGUOUS, RESTYPE_ATOM14_SWAP = _atom14_ambiguity_tables()


def _atom14_radius() -> np.ndarray:
    """[21, 14] van der Waals radius of every atom14 atom (0 where absent)."""
    out = np.zeros((NUM_AATYPE, NUM_ATOM14), dtype=np.float32)
    for r, name3 in enumerate(RESTYPE_3):
        for i, atom in enumerate(RESTYPE_ATOM14_NAMES[name3]):
            out[r, i] = VAN_DER_WAALS_RADIUS[atom[0]]
    return out


RESTYPE_ATOM14_RADIUS = _atom14_radius()


@functools.lru_cache(maxsize=None)
def atom14_distance_bounds(overlap_tolerance: float = 1.5,
                           bond_length_tolerance_factor: float = 15.0) -> dict[str, np.ndarray]:
    """Within-residue distance bounds [21, 14, 14] (AF2 `make_atom14_dists_bounds`): bonded and
    angle-closing ("virtual") pairs get mean +- factor * stddev, every other pair only the clash
    bound (sum of radii - tolerance) from below. Keys lower_bound, upper_bound, stddev."""
    lower = np.zeros((NUM_AATYPE, NUM_ATOM14, NUM_ATOM14), np.float32)
    upper = np.zeros_like(lower)
    stddev = np.zeros_like(lower)
    bonds, virtual_bonds = residue_bonds()
    for r, name3 in enumerate(RESTYPE_3[:-1]):
        names = RESTYPE_ATOM14_NAMES[name3]
        radius = RESTYPE_ATOM14_RADIUS[r]
        n = len(names)
        lower[r, :n, :n] = radius[:n, None] + radius[None, :n] - overlap_tolerance
        upper[r, :n, :n] = 1e10
        idx = np.arange(n)
        lower[r, idx, idx] = upper[r, idx, idx] = 0.0
        for a1, a2, length, sd in bonds[name3] + virtual_bonds[name3]:
            i, j = names.index(a1), names.index(a2)
            lower[r, i, j] = lower[r, j, i] = length - bond_length_tolerance_factor * sd
            upper[r, i, j] = upper[r, j, i] = length + bond_length_tolerance_factor * sd
            stddev[r, i, j] = stddev[r, j, i] = sd
    return {"lower_bound": lower, "upper_bound": upper, "stddev": stddev}


@functools.lru_cache(maxsize=None)
def residue_bonds() -> tuple[dict, dict]:
    """Literature bond lengths per residue and the "virtual bonds" closing each bond angle
    (law of cosines, uncertainty propagated as in AF2 `load_stereo_chemical_props`):
    ({resname: [(atom1, atom2, length, stddev)]}, same for virtual bonds)."""
    from protdp.data.stereo_chemical_props import bond_angles, bond_lengths

    bonds = {name: list(v) for name, v in bond_lengths().items()}
    virtual = {}
    for name, angles in bond_angles().items():
        lookup = {frozenset((a1, a2)): (length, sd) for a1, a2, length, sd in bonds[name]}
        virtual[name] = []
        for a1, a2, a3, gamma, sd_gamma in angles:
            (b1, sd1), (b2, sd2) = lookup[frozenset((a1, a2))], lookup[frozenset((a2, a3))]
            length = np.sqrt(b1 ** 2 + b2 ** 2 - 2 * b1 * b2 * np.cos(gamma))
            d_gamma = b1 * b2 * np.sin(gamma) / length
            d_b1 = (b1 - b2 * np.cos(gamma)) / length
            d_b2 = (b2 - b1 * np.cos(gamma)) / length
            sd = np.sqrt((d_gamma * sd_gamma) ** 2 + (d_b1 * sd1) ** 2 + (d_b2 * sd2) ** 2)
            virtual[name].append((a1, a3, float(length), float(sd)))
    return bonds, virtual


def atom37_from_backbone(aatype: np.ndarray, backbone_positions: np.ndarray,
                         backbone_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Store-v1 backbone (N, CA, C, O, CB) -> atom37 positions [L, 37, 3] and mask [L, 37].

    The five atoms go to atom37 slots N 0, CA 1, C 2, O 4, CB 3; atoms the residue type does not
    have (glycine's virtual CB, everything of X) are masked out."""
    L = len(aatype)
    pos = np.zeros((L, NUM_ATOM37, 3), np.float32)
    mask = np.zeros((L, NUM_ATOM37), np.float32)
    slots = list(BACKBONE_ATOM37_SLOTS)
    pos[:, slots] = backbone_positions
    mask[:, slots] = backbone_mask
    exists = RESTYPE_ATOM37_MASK[np.minimum(np.asarray(aatype, np.int64), UNK_ID)]
    return pos * exists[..., None], mask * exists


def backbone_from_atom37(positions: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """atom37 -> the derived backbone arrays (N, CA, C, O, CB) [..., 5, 3] / [..., 5]."""
    slots = list(BACKBONE_ATOM37_SLOTS)
    return positions[..., slots, :], mask[..., slots]
