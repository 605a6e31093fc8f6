"""Residue and token vocabulary shared by data, model and inference (AF2 conventions).

AF2 order of the 20 standard amino acids (`residue_constants.restypes`), then the
unknown token X, the gap token and the BERT mask token:

    0..19  A R N D C Q E G H I L K M F P S T W Y V
    20     X   (unknown / non-standard letters: B, Z, J, U, O, ...)
    21     -   (gap)
    22     mask (masked-MSA input token)

The MSA one-hot therefore has 23 classes (AF2 `msa_feat` uses 23 + deletions).
"""

from __future__ import annotations

import numpy as np

RESTYPES = "ARNDCQEGHILKMFPSTWYV"
UNK_ID = 20
GAP_ID = 21
MASK_ID = 22
NUM_AA = 20              # standard amino acids
NUM_AATYPE = 21          # aatype classes (20 + X)
NUM_MSA_TOKENS = 23      # MSA classes (20 + X + gap + mask)

# Backbone atoms stored per residue, in this order (CB virtual for GLY).
BACKBONE_ATOMS = ("N", "CA", "C", "O", "CB")

THREE_TO_ONE = {
    "ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q", "GLU": "E",
    "GLY": "G", "HIS": "H", "ILE": "I", "LEU": "L", "LYS": "K", "MET": "M", "PHE": "F",
    "PRO": "P", "SER": "S", "THR": "T", "TRP": "W", "TYR": "Y", "VAL": "V",
}

# Common modified residues -> parent (PDB chemical component parents).
MODIFIED_TO_PARENT = {
    "MSE": "MET", "SEP": "SER", "TPO": "THR", "PTR": "TYR", "CSO": "CYS", "CSD": "CYS",
    "CME": "CYS", "CSS": "CYS", "CAS": "CYS", "OCS": "CYS", "KCX": "LYS", "MLY": "LYS",
    "M3L": "LYS", "LLP": "LYS", "HYP": "PRO", "PCA": "GLU", "MLE": "LEU", "NLE": "LEU",
    "HIC": "HIS", "SAC": "SER", "ALY": "LYS", "FME": "MET", "CGU": "GLU", "DAL": "ALA",
    "SEC": "CYS", "PYL": "LYS", "ASX": "ASP", "GLX": "GLU",
}

_LETTER_TO_ID = {aa: i for i, aa in enumerate(RESTYPES)}
_LETTER_TO_ID["-"] = GAP_ID
_LETTER_TO_ID["."] = GAP_ID

# 256-entry lookup table: byte -> token id; anything unknown maps to X.
_LUT = np.full(256, UNK_ID, dtype=np.uint8)
for _ch, _i in _LETTER_TO_ID.items():
    _LUT[ord(_ch)] = _i
    _LUT[ord(_ch.lower())] = _i


def sequence_to_ids(seq: str) -> np.ndarray:
    """One-letter (aligned) sequence -> uint8 token ids [L]; '-'/'.' -> gap, others -> X
    (AF2's aatype: `sequence_to_onehot(..., map_unknown_to_x=True)`)."""
    return _LUT[np.frombuffer(seq.encode("ascii", "replace"), dtype=np.uint8)]


# MSA rows read the ambiguity codes as HHblits does (AF2 `HHBLITS_AA_TO_ID` followed by
# `correct_msa_restypes`): B -> D, Z -> E, U -> C; J, O and anything unknown -> X.
HHBLITS_AMBIGUOUS = {"B": "D", "Z": "E", "U": "C"}
_MSA_LUT = _LUT.copy()
for _ch, _to in HHBLITS_AMBIGUOUS.items():
    _MSA_LUT[ord(_ch)] = _MSA_LUT[ord(_ch.lower())] = _LETTER_TO_ID[_to]

# HHblits integer order (AF2 `HHBLITS_AA_TO_ID`: A C D E F G H I K L M N P Q R S T V W Y X -)
# -> protdp / AF2 ids, for MSAs stored as HHblits integers (AF2's raw `msa` feature)
HHBLITS_ORDER = "ACDEFGHIKLMNPQRSTVWYX-"
HHBLITS_TO_ID = np.array([_LETTER_TO_ID.get(ch, UNK_ID) for ch in HHBLITS_ORDER], dtype=np.uint8)


def msa_row_to_ids(row: str) -> np.ndarray:
    """Aligned MSA row -> uint8 token ids [L] with HHblits' reading of B/Z/U (see above)."""
    return _MSA_LUT[np.frombuffer(row.encode("ascii", "replace"), dtype=np.uint8)]


def ids_to_sequence(ids) -> str:
    """Token ids -> one-letter string (X for unknown, '-' for gap, '#' for mask)."""
    table = RESTYPES + "X-#"
    return "".join(table[int(i)] for i in ids)


def residue_name_to_letter(resname: str) -> str:
    """Three-letter residue name (modified residues mapped to parent) -> one letter, X if unknown."""
    name = resname.strip().upper()
    name = MODIFIED_TO_PARENT.get(name, name)
    return THREE_TO_ONE.get(name, "X")
