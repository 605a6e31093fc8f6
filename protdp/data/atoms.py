"""Structure files -> validated Biopython models and per-residue atom37 arrays.

Reading (`read_structure`): Bio.PDB builds the model, after a validation pass of our own that
the library does not do. PDB: every ATOM/HETATM line must hold the columns the reader uses
(residue number, x, y, z in columns 23-26 and 31-54); a line cut short, a coordinate that is not
a number, not finite or beyond the format's limit |x| <= 9999.999 is dropped with a warning
naming the line; a file whose last record is cut (no final newline, last coordinate record
shorter than the others) is rejected as truncated. mmCIF: the `_atom_site` table is tokenized by
Biopython's `MMCIF2Dict`, its columns checked (a missing required column, unequal column
lengths = a truncated table, bad rows dropped with a warning) and only then built.

Atoms (`residue_atom37`, AF2 `atom37` order from `protdp.data.residue_constants`): first model,
highest-occupancy altloc (Bio.PDB's selected child; a point mutation keeps the residue with the
highest mean occupancy), standard residues keep the heavy atoms of their type plus OXT, modified
residues (`MODIFIED_TO_PARENT`) keep the atoms whose names match their parent's (MSE's SE is the
parent's SD, as in AF2 `templates._get_atom_positions`), unknown residues keep N, CA, C, O, CB.
`backbone_from_atom37` derives the N, CA, C, O, CB view (ideal virtual CB for glycine).
"""

from __future__ import annotations

import io
import math
import warnings as pywarnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protdp.data.residue_constants import ATOM_ORDER, NUM_ATOM37, RESTYPE_ATOM14_NAMES
from protdp.data.residues import (BACKBONE_ATOMS, MODIFIED_TO_PARENT, THREE_TO_ONE,
                                  residue_name_to_letter)
from protdp.data.safeio import format_suffix, read_text
from protdp.errors import InputError

COORD_LIMIT = 9999.999          # PDB's %8.3f field: any |coordinate| beyond it is absurd
MAX_WARNINGS = 20               # warnings kept verbatim per file (the rest are counted)
STRUCTURE_FORMATS = {".pdb": "pdb", ".ent": "pdb", ".cif": "cif", ".mmcif": "cif"}
BACKBONE_ATOM37 = np.array([ATOM_ORDER[a] for a in BACKBONE_ATOMS])   # N, CA, C, O, CB
_COORD_RECORDS = ("ATOM  ", "HETATM")
_UNUSED_RECORDS = ("ANISOU", "SIGATM", "SIGUIJ")    # per-atom extras protdp never reads
_UNKNOWN_ATOMS = ("N", "CA", "C", "O", "CB")


@dataclass
class StructureData:
    """A parsed structure file: first model, header facts and what validation dropped."""
    model: object                   # Bio.PDB Model (first model) or None if no coordinates
    fmt: str                        # 'pdb' | 'cif'
    text: str                       # the decoded file text (SEQRES lines are read from it)
    cif: dict | None                # MMCIF2Dict of the file (mmCIF only)
    resolution: float               # Å; NaN if unknown
    warnings: list[str] = field(default_factory=list)
    dropped_atoms: int = 0          # atoms (rows/lines) dropped by validation


def _warn(warnings: list[str], message: str) -> None:
    if len(warnings) < MAX_WARNINGS:
        warnings.append(message)


def _coord_problem(values) -> str | None:
    """Why a coordinate triple is unusable, or None."""
    for v in values:
        if not math.isfinite(v):
            return f"coordinate {v} is not finite"
        if abs(v) > COORD_LIMIT:
            return f"coordinate {v:g} is beyond the PDB limit |x| <= {COORD_LIMIT}"
    return None


# -------------------------------------------------------------------------------------- PDB

def _pdb_line_problem(line: str) -> str | None:
    """Why Bio.PDB would misread this ATOM/HETATM line (it slices fixed columns blindly)."""
    if len(line) < 54:
        return (f"{line[:6].strip()} record has {len(line)} columns; x, y, z need columns "
                f"31-54 (line cut short)")
    try:
        int(line[22:26])
    except ValueError:
        return f"residue number '{line[22:26].strip()}' (columns 23-26) is not an integer"
    try:
        xyz = [float(line[c:c + 8]) for c in (30, 38, 46)]
    except ValueError:
        return f"coordinates '{line[30:54].strip()}' (columns 31-54) are not numbers"
    return _coord_problem(xyz)


def _pdb_truncated(lines: list[str], ends_with_newline: bool) -> int | None:
    """Line number of a cut last record, or None. A file cut at a random byte ends without a
    newline inside a coordinate record that is shorter than the file's other records."""
    if ends_with_newline or not lines:
        return None
    last = lines[-1]
    if 0 < len(last) < 6 and any(r.startswith(last) for r in _COORD_RECORDS + _UNUSED_RECORDS):
        return len(lines)         # cut inside the record name ('ATO'): its atom is lost
    if not last.startswith(_COORD_RECORDS + _UNUSED_RECORDS + ("TER",)):
        return None
    others = [len(l) for l in lines[-200:-1] if l.startswith(last[:6])]
    if len(last) < 54 or (others and len(last) < max(others)):
        return len(lines)
    return None


def clean_pdb_text(text: str, path: Path) -> tuple[str, list[str], int]:
    """PDB text with every unusable coordinate line removed -> (text, warnings, dropped).
    Lines keep their order; unused per-atom records (ANISOU, ...) are left out."""
    ends = text.endswith("\n")
    lines = text.split("\n")
    if ends:
        lines.pop()
    cut = _pdb_truncated(lines, ends)
    if cut is not None:
        raise InputError("file is truncated: its last record is cut off (no final newline, "
                         "shorter than the other records); expected a complete PDB file",
                         path=path, line=cut)
    kept, warnings, dropped = [], [], 0
    if lines and lines[0].startswith("HEADER") and not any(l[:6].strip() == "END"
                                                           for l in lines[-50:]):
        warnings.append(f"{path.name}: no END record although the file starts with HEADER "
                        f"(a PDB entry ends with END): it may be truncated at a line boundary")
    for lineno, line in enumerate(lines, 1):
        if line.startswith(_UNUSED_RECORDS):
            continue
        if line.startswith(_COORD_RECORDS):
            why = _pdb_line_problem(line)
            if why is not None:
                dropped += 1
                _warn(warnings, f"{path.name}:{lineno}: atom dropped: {why}")
                continue
            if len(line) < 66 or not line[54:66].strip():   # no occupancy / B: PDB defaults
                line = f"{line[:54]:<54}  1.00  0.00{line[66:]}"
        kept.append(line)
    return "\n".join(kept) + "\n", warnings, dropped


def _parse_pdb(text: str, path: Path) -> StructureData:
    from Bio.PDB import PDBParser

    clean, warnings, dropped = clean_pdb_text(text, path)
    parser = PDBParser(QUIET=True, PERMISSIVE=True)
    try:
        structure = parser.get_structure(path.name, io.StringIO(clean))
    except Exception:   # Biopython raises many types for malformed files; one clear line
        raise InputError("not a readable PDB file: the coordinate records are malformed "
                         "(expected fixed-column ATOM/HETATM records)", path=path) from None
    models = list(structure)
    resolution = _finite_positive([structure.header.get("resolution")])
    return StructureData(models[0] if models else None, "pdb", text, None, resolution,
                         warnings, dropped)


# ------------------------------------------------------------------------------------ mmCIF

_CIF_REQUIRED = (("_atom_site.label_atom_id", "_atom_site.auth_atom_id"),
                 ("_atom_site.label_comp_id", "_atom_site.auth_comp_id"),
                 ("_atom_site.auth_asym_id", "_atom_site.label_asym_id"),
                 ("_atom_site.auth_seq_id", "_atom_site.label_seq_id"),
                 ("_atom_site.Cartn_x",), ("_atom_site.Cartn_y",), ("_atom_site.Cartn_z",))
# optional columns Bio.PDB insists on, with the value mmCIF means when they are absent
_CIF_DEFAULTS = {"_atom_site.label_alt_id": ".", "_atom_site.pdbx_PDB_ins_code": "?",
                 "_atom_site.occupancy": "1.0", "_atom_site.B_iso_or_equiv": "0.0",
                 "_atom_site.group_PDB": "ATOM", "_atom_site.pdbx_PDB_model_num": "1"}


def _cif_truncated(text: str) -> bool:
    """A cut mmCIF ends without a newline inside the atom table, its last row shorter than the
    row before it (fewer values, or a shorter last value)."""
    if text.endswith("\n"):
        return False
    lines = text.rstrip("\n").split("\n")
    last = lines[-1].split()
    if not last or last[0] not in ("ATOM", "HETATM") or len(lines) < 2:
        return False
    prev = lines[-2].split()
    return len(last) != len(prev) or len(last[-1]) < len(prev[-1])


def _cif_columns(d: dict, path: Path) -> dict:
    """Check the _atom_site table; fill optional columns; return the (shared) column dict."""
    if not any(k.startswith("_atom_site.") for k in d):
        raise InputError("no _atom_site table (an mmCIF structure lists its atoms in "
                         "_atom_site)", path=path)
    for names in _CIF_REQUIRED:
        if not any(n in d for n in names):
            raise InputError(f"the _atom_site table has no {' or '.join(names)} column",
                             path=path)
    cols = {k: v for k, v in d.items() if k.startswith("_atom_site.")}
    for k, v in list(cols.items()):
        if not isinstance(v, list):
            cols[k] = [v]
    n = len(cols["_atom_site.Cartn_x"])
    lengths = {len(v) for v in cols.values()}
    if len(lengths) > 1:
        raise InputError(f"the _atom_site table is truncated or malformed: its columns have "
                         f"{min(lengths)} to {max(lengths)} values (a row is incomplete)",
                         path=path)
    for k, default in _CIF_DEFAULTS.items():
        cols.setdefault(k, [default] * n)
    for a, b in (("_atom_site.label_atom_id", "_atom_site.auth_atom_id"),
                 ("_atom_site.label_comp_id", "_atom_site.auth_comp_id"),
                 ("_atom_site.auth_asym_id", "_atom_site.label_asym_id"),
                 ("_atom_site.auth_seq_id", "_atom_site.label_seq_id")):
        if a not in cols:
            cols[a] = cols[b]
    cols.setdefault("_atom_site.id", [str(i + 1) for i in range(n)])
    return cols


def _cif_row_problem(cols: dict, i: int) -> str | None:
    try:
        xyz = [float(cols[f"_atom_site.Cartn_{c}"][i]) for c in "xyz"]
    except ValueError:
        return "coordinates are not numbers"
    why = _coord_problem(xyz)
    if why:
        return why
    seq = cols["_atom_site.auth_seq_id"][i]
    if seq not in (".", "?"):
        try:
            int(seq)
        except ValueError:
            return f"residue number '{seq}' is not an integer"
    try:
        int(cols["_atom_site.pdbx_PDB_model_num"][i])
    except ValueError:
        return "model number is not an integer"
    return None


def clean_cif_dict(d: dict, path: Path) -> tuple[dict, list[str], int]:
    """MMCIF2Dict with unusable `_atom_site` rows removed -> (dict, warnings, dropped)."""
    cols = _cif_columns(d, path)
    n = len(cols["_atom_site.Cartn_x"])
    keep, warnings = [], []
    for i in range(n):
        why = _cif_row_problem(cols, i)
        if why is None:
            keep.append(i)
        else:
            _warn(warnings, f"{path.name}: _atom_site row {i + 1} (atom id "
                            f"{cols['_atom_site.id'][i]}) dropped: {why}")
    for k, default in (("_atom_site.occupancy", "1.0"), ("_atom_site.B_iso_or_equiv", "0.0")):
        cols[k] = [v if _is_float(v) else default for v in cols[k]]
    out = {k: v for k, v in d.items()
           if not k.startswith(("_atom_site.", "_atom_site_anisotrop."))}
    out.update({k: [v[i] for i in keep] for k, v in cols.items()})
    return out, warnings, n - len(keep)


def _is_float(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _parse_cif(text: str, path: Path) -> StructureData:
    from Bio.PDB.MMCIF2Dict import MMCIF2Dict
    from Bio.PDB.MMCIFParser import MMCIFParser

    head = [ln[:6] for ln in text.lstrip().split("\n", 50)[:50]]
    if not text.lstrip().startswith("data_") and any(
            h in ("ATOM  ", "HETATM", "HEADER", "CRYST1", "MODEL ") for h in head):
        raise InputError("holds PDB-format records (fixed-column ATOM/HEADER lines), not "
                         "mmCIF, but is named .cif; rename it to .pdb", path=path)
    if _cif_truncated(text):
        raise InputError("file is truncated: it ends inside an _atom_site row (no final "
                         "newline, fewer values than the row before)", path=path,
                         line=text.count("\n") + 1)
    try:
        raw = MMCIF2Dict(io.StringIO(text))
    except Exception:
        cut = "" if text.endswith("\n") else " (it ends without a newline: truncated?)"
        raise InputError(f"not a readable mmCIF file: unbalanced quotes, an unterminated ';' "
                         f"text field or a malformed loop{cut}; expected an mmCIF/PDBx data "
                         f"block", path=path) from None
    d, warnings, dropped = clean_cif_dict(raw, path)

    class _FromDict(MMCIFParser):      # build from the checked dict instead of re-reading
        def structure_from(self, mmcif_dict):
            from Bio.PDB.PDBExceptions import PDBConstructionWarning
            with pywarnings.catch_warnings():
                pywarnings.simplefilter("ignore", PDBConstructionWarning)
                self._mmcif_dict = mmcif_dict
                self._build_structure(path.name)
                self._structure_builder.set_header(self._get_header())
            return self._structure_builder.get_structure()

    try:
        structure = _FromDict(QUIET=True).structure_from(d)
    except Exception:
        raise InputError("not a readable mmCIF file: the _atom_site table is inconsistent "
                         "(expected one row per atom with the standard columns)",
                         path=path) from None
    models = list(structure)
    resolution = _finite_positive([_first(d.get(k)) for k in (
        "_refine.ls_d_res_high", "_em_3d_reconstruction.resolution",
        "_reflns.d_resolution_high")])
    return StructureData(models[0] if models else None, "cif", text, d, resolution,
                         warnings, dropped)


def _first(v):
    return v[0] if isinstance(v, list) and v else v


def _finite_positive(values) -> float:
    for v in values:
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x) and x > 0:
            return x
    return float("nan")


def structure_format(path: str | Path) -> str:
    """'pdb' or 'cif' from the extension (a trailing .gz is ignored)."""
    fmt = STRUCTURE_FORMATS.get(format_suffix(path))
    if fmt is None:
        raise InputError(f"unknown structure extension '{format_suffix(path)}'; expected "
                         f"{sorted(STRUCTURE_FORMATS)} (optionally .gz)", path=path)
    return fmt


def read_structure(path: str | Path) -> StructureData:
    """Read and validate a PDB / mmCIF file (plain or .gz). InputError names the problem."""
    path = Path(path)
    fmt = structure_format(path)
    text = read_text(path)
    if not text.strip():
        raise InputError("file is empty (no coordinates)", path=path)
    return _parse_pdb(text, path) if fmt == "pdb" else _parse_cif(text, path)


# ------------------------------------------------------------------------------- residues

def pick_residue(res):
    """DisorderedResidue (point mutation) -> child with highest mean occupancy."""
    if res.is_disordered() == 2:
        return max(res.disordered_get_list(),
                   key=lambda r: np.mean([a.get_occupancy() or 0.0 for a in r]))
    return res


def is_amino_acid(res) -> bool:
    """Standard, known-modified, or an unknown ATOM residue with a CA (-> X); never water."""
    het, _, _ = res.id
    name = res.get_resname().strip().upper()
    if het == "W":
        return False
    if name in THREE_TO_ONE or name in MODIFIED_TO_PARENT:
        return True
    return het == " " and "CA" in res


def _allowed_atoms(resname: str) -> frozenset:
    parent = MODIFIED_TO_PARENT.get(resname, resname)
    names = RESTYPE_ATOM14_NAMES.get(parent) or _UNKNOWN_ATOMS
    return frozenset(names) | {"OXT"}


def residue_atom37(res) -> tuple[np.ndarray, np.ndarray]:
    """One Bio.PDB residue -> positions float32 [37, 3] (Å, 0 where missing), mask bool [37]."""
    resname = res.get_resname().strip().upper()
    allowed = _allowed_atoms(resname)
    pos = np.zeros((NUM_ATOM37, 3), np.float32)
    mask = np.zeros(NUM_ATOM37, bool)
    for atom in res:
        name = atom.get_name().upper()      # "CA  " (calcium, PDB column 13) is not "CA"
        if resname == "MSE" and name == "SE":
            name = "SD"                  # selenomethionine's Se sits where Met's S does
        if name in allowed:
            k = ATOM_ORDER[name]
            pos[k] = atom.get_coord()
            mask[k] = True
    return pos, mask


def residue_letter(res) -> str:
    return residue_name_to_letter(res.get_resname())


# ------------------------------------------------------------------------------- backbone

def virtual_cb(n: np.ndarray, ca: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Ideal CB from backbone (trRosetta / AF2 pseudo-beta constants). [..., 3]."""
    b = ca - n
    cc = c - ca
    a = np.cross(b, cc)
    return -0.58273431 * a + 0.56802827 * b - 0.54067466 * cc + ca


def backbone_from_atom37(sequence: str, positions: np.ndarray, mask: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """atom37 [L, 37, 3] / [L, 37] -> N, CA, C, O, CB float32 [L, 5, 3] and uint8 [L, 5]; CB of
    glycine is the ideal virtual CB where N, CA and C are observed (as in store v1)."""
    pos = np.asarray(positions, np.float32)[:, BACKBONE_ATOM37].copy()     # [L, 5, 3]
    msk = np.asarray(mask).astype(bool)[:, BACKBONE_ATOM37].copy()           # [L, 5]
    gly = np.frombuffer(sequence.encode("ascii", "replace"), np.uint8) == ord("G")
    need = gly & msk[:, :3].all(1) & ~msk[:, 4]                             # [L]
    if need.any():
        pos[need, 4] = virtual_cb(pos[need, 0], pos[need, 1], pos[need, 2])
        msk[need, 4] = True
    return pos, msk.astype(np.uint8)
