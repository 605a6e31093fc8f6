"""Prediction outputs: PDB / mmCIF with pLDDT in the B-factor column, JSON files, summary.tsv.

AlphaFold convention (AF2 `protein.to_pdb`, AFDB files): all heavy atoms of every residue, in
atom37 order (`protdp.data.residue_constants.ATOM_TYPES`), each carrying its residue's pLDDT
(0-100) as its B-factor; atoms outside the atom mask (the residue type lacks them) are not
written. Biopython's `PDBIO` / `MMCIFIO` do the formatting; pLDDT is rounded to 2 decimals first
(the PDB B-factor field is %6.2f) so that every file and scores.json carry identical values.

Target ids are user input: `safe_name` turns one into a file name that can only ever name an
entry inside the output folder; the original id is kept in the JSON files.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import re
from pathlib import Path
from typing import Iterable

import numpy as np
from Bio.PDB.StructureBuilder import StructureBuilder

from protdp.data.residue_constants import ATOM_TYPES, NUM_ATOM37, RESTYPE_ATOM37_MASK
from protdp.data.residues import sequence_to_ids
from protdp.data.safeio import save_structure
from protdp.fileio import atomic_write_bytes
from protdp.inference.json_text import strict_json
from protdp.text import printable   # one definition (protdp/text.py); callers import it here

ONE_TO_THREE = {"A": "ALA", "R": "ARG", "N": "ASN", "D": "ASP", "C": "CYS", "Q": "GLN",
                "E": "GLU", "G": "GLY", "H": "HIS", "I": "ILE", "L": "LEU", "K": "LYS",
                "M": "MET", "F": "PHE", "P": "PRO", "S": "SER", "T": "THR", "W": "TRP",
                "Y": "TYR", "V": "VAL", "X": "UNK"}
_SAFE_RE = re.compile(r"[^A-Za-z0-9_.-]+")
MAX_NAME = 64
SUMMARY_COLUMNS = ("index", "target", "file_name", "length", "route", "reasons", "mean_plddt",
                   "band", "ptm", "msa_depth", "status", "detail")


def safe_name(target_id: str) -> str:
    """File-system-safe, deterministic name for a target id (a pure function, so resume finds
    the same folder). Unchanged when the id is already a plain name: [A-Za-z0-9_.-], at most
    53 characters, no '..', starting and ending with a letter or digit; otherwise the cleaned
    id plus 10 hex digits of the id's SHA-256 (so distinct ids do not collide). Never contains
    '/', '\\' or '..', never starts with '.', at most 64 characters."""
    cleaned = _SAFE_RE.sub("_", target_id).strip("._-")
    cleaned = re.sub(r"\.{2,}", "_", cleaned)[:MAX_NAME - 11]
    if cleaned == target_id and 0 < len(target_id) <= MAX_NAME - 11:
        return target_id
    digest = hashlib.sha256(target_id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{cleaned}-{digest}" if cleaned else f"target-{digest}"


def _structure(name: str, sequence: str, positions: np.ndarray, mask: np.ndarray, plddt: np.ndarray):
    """Biopython Structure of one chain A. positions [L, 37, 3] Å, mask [L, 37], plddt [L]."""
    sb = StructureBuilder()
    sb.init_structure(name)
    sb.init_model(0)
    sb.init_chain("A")
    sb.init_seg("    ")
    for i, aa in enumerate(sequence):
        sb.init_residue(ONE_TO_THREE.get(aa, "UNK"), " ", i + 1, " ")
        for a in np.nonzero(mask[i] > 0)[0]:
            atom = ATOM_TYPES[a]
            sb.init_atom(atom, positions[i, a], float(plddt[i]), 1.0, " ",
                         atom.ljust(3).rjust(4) if len(atom) < 4 else atom, element=atom[0])
    return sb.get_structure()


def round_plddt(plddt: np.ndarray) -> np.ndarray:
    """pLDDT as written to files: 2 decimals (the PDB B-factor precision)."""
    return np.round(np.asarray(plddt, dtype=np.float64), 2)


def write_structures(directory: Path, name: str, sequence: str, positions: np.ndarray,
                     plddt: np.ndarray, mask: np.ndarray | None = None,
                     kinds: tuple[str, ...] = ("pdb", "cif")) -> dict[str, Path]:
    """Write `<name>.pdb` and `<name>.cif` (all atoms, pLDDT as B-factor) from atom37 positions
    [L, 37, 3] and mask [L, 37] (default: every atom the residue type has); returns
    {'pdb': p, 'cif': p}."""
    positions = np.asarray(positions, dtype=np.float64)           # [L, 37, 3]
    if positions.shape != (len(sequence), NUM_ATOM37, 3):
        raise ValueError(f"positions shape {positions.shape} != ({len(sequence)}, {NUM_ATOM37}, 3)")
    if mask is None:
        mask = RESTYPE_ATOM37_MASK[sequence_to_ids(sequence)]
    mask = np.asarray(mask)
    if mask.shape != positions.shape[:2]:
        raise ValueError(f"mask shape {mask.shape} != {positions.shape[:2]}")
    if not np.all(np.isfinite(positions[mask > 0])):
        raise ValueError("cannot write non-finite coordinates")
    structure = _structure(name, sequence, positions, mask, round_plddt(plddt))
    return save_structure(structure, directory, name, kinds)


def write_json(path: Path, obj: dict) -> Path:
    """Strict JSON (NaN/Inf become null, `json_text.json_plain`), indent 1, written
    atomically; a PAE matrix in it (`json_text.JsonMatrix`) is encoded once for every file."""
    return atomic_write_bytes(path, strict_json(obj, indent=1).encode())


def summary_row(row: dict) -> list[str]:
    """One TSV line's cells; user text through `printable`, so no tab/newline/control/bidi
    character survives, "\\" is doubled, and non-ASCII letters ("Å", "naïve") stay as written."""
    def fmt(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return "" if not math.isfinite(v) else f"{v:.2f}"
        if isinstance(v, (list, tuple)):
            return ",".join(str(x) for x in v)
        return printable(str(v))
    return [fmt(row.get(c)) for c in SUMMARY_COLUMNS]


def write_summary(path: Path, rows: Iterable[dict]) -> Path:
    """summary.tsv: header + one row per target, in input order; written atomically."""
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow(SUMMARY_COLUMNS)
    for row in sorted(rows, key=lambda r: r["index"]):
        writer.writerow(summary_row(row))
    return atomic_write_bytes(path, buf.getvalue().encode())


def read_summary(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))



