"""Template structures from mmCIF files (gemmi's CIF reader), in the shape AlphaFold's
`mmcif_parsing.parse` + `templates._get_atom_positions` give them (AF v2.3.2):

- protein chains: entities of `_entity_poly_seq` with any monomer whose `_chem_comp.type`
  contains "peptide", keyed by author chain id (`_atom_site` of the first model maps label ->
  author chain ids), in entity / `_struct_asym` order;
- `seqres`: one letter per `_entity_poly_seq` monomer (standard residues and their tabulated
  modified forms by gemmi's parent table, otherwise X);
- `seqres_to_structure`: seqres index (label_seq_id - first num) -> the residue's author key
  (hetflag, auth_seq_id, insertion code), or None when unobserved;
- atom37 positions/mask per seqres residue (first model; per atom name the alternate location
  of highest occupancy, the first on ties, as Biopython's parser picks it; MSE's SE stored as
  SD; ARG NH1/NH2 swapped when NH2 is the one closer to CD);
- release date: the oldest `_pdbx_audit_revision_history.revision_date`.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import gemmi
import numpy as np

from protdp.data import residue_constants as rc
from protdp.data.atoms import COORD_LIMIT
from protdp.data.bounds import MAX_RESIDUES
from protdp.errors import InputError

ATOM37 = len(rc.ATOM_TYPES)
MAX_CA_CA_DISTANCE = 150.0        # AF2 templates.py: "essentially infinity"


@dataclass
class TemplateStructure:
    """One parsed mmCIF entry (see the module docstring)."""

    file_id: str
    release_date: dt.date | None
    chain_to_seqres: dict[str, str] = field(default_factory=dict)
    seqres_to_structure: dict[str, list] = field(default_factory=dict)
    atoms: dict[tuple, dict[str, tuple]] = field(default_factory=dict)   # residue key -> atoms


def _one_letter(mon_id: str) -> str:
    info = gemmi.find_tabulated_residue(mon_id)
    if info is None or not info.is_amino_acid():
        return "X"
    code = info.one_letter_code.upper()
    return code if code in rc.RESTYPES else "X"


def _loop(block: gemmi.cif.Block, category: str, tags: list[str]) -> list[list[str]]:
    table = block.find(category, tags)
    return [[row.str(i) for i in range(len(tags))] for row in table]


def _number(text: str, kind, category: str, tag: str, path: Path, row: int) -> int | float:
    """`int(text)` / `float(text)` of one mmCIF field; '?', '.', words and non-finite values are
    an InputError naming the file, field, row and value (a template must never be NaN)."""
    try:
        value = kind(text)
    except (TypeError, ValueError):
        value = None
    if value is None or (kind is float and not math.isfinite(value)) or \
            (kind is float and abs(value) > COORD_LIMIT):
        shown = repr(text[:40]) if text else "unknown ('?' or '.')"
        raise InputError(f"row {row}: {shown} is not a finite number"
                         + (f" (|x| <= {COORD_LIMIT:g})" if kind is float else ""),
                         path=path, field=f"{category}{tag}")
    return value


def _open_block(path: Path, data: bytes | None = None):
    """The sole data block of an mmCIF file (parsed from `data`, its bytes read earlier, when
    given); unreadable or empty is an InputError naming it."""
    try:
        doc = gemmi.cif.read(str(path)) if data is None else gemmi.cif.read_string(data)
        if len(doc) == 0:               # an empty file: sole_block() raises an IndexError
            raise InputError("not a readable mmCIF file: no data block (empty file?)", path=path)
        return doc.sole_block()
    except (RuntimeError, ValueError, OSError) as exc:
        raise InputError(f"not a readable mmCIF file: {str(exc).splitlines()[0][:200]}",
                         path=path) from None


def _release_date(block, path: Path) -> dt.date | None:
    """The earliest revision date ('?' / '.' is unknown, anything else not a date an error)."""
    release = None
    for raw in block.find_values("_pdbx_audit_revision_history.revision_date"):
        text = gemmi.cif.as_string(raw)
        if not text:                                    # '?' / '.': unknown, not an error
            continue
        try:
            day = dt.date.fromisoformat(text)
        except ValueError:
            raise InputError(f"_pdbx_audit_revision_history.revision_date {text[:40]!r} is not "
                             "a date (YYYY-MM-DD)", path=path) from None
        release = day if release is None else min(release, day)
    return release


def read_structure(path: str | Path, file_id: str | None = None,
                   data: bytes | None = None) -> TemplateStructure:
    """Parse `path` (or `data`, the bytes read from it); a file that is not an mmCIF with protein
    chains is an InputError naming it."""
    path = Path(path)
    block = _open_block(path, data)
    file_id = (file_id or path.stem).lower()
    release = _release_date(block, path)
    out = TemplateStructure(file_id, release)

    chem = {r[0]: r[1] for r in _loop(block, "_chem_comp.", ["id", "type"])}
    polymers: dict[str, list[tuple[str, int]]] = {}
    for k, (entity, num, mon) in enumerate(_loop(block, "_entity_poly_seq.",
                                                 ["entity_id", "num", "mon_id"]), 1):
        polymers.setdefault(entity, []).append(
            (mon, _number(num, int, "_entity_poly_seq.", "num", path, k)))
    if any(len(seq) > MAX_RESIDUES for seq in polymers.values()):
        raise InputError(f"an entity longer than {MAX_RESIDUES} residues (protdp.data.bounds)",
                         path=path, field="_entity_poly_seq.num")
    asyms: dict[str, list[str]] = {}
    for asym, entity in _loop(block, "_struct_asym.", ["id", "entity_id"]):
        asyms.setdefault(entity, []).append(asym)
    valid = {}
    for entity, seq in polymers.items():
        if any("peptide" in chem.get(mon, "").lower() for mon, _ in seq):
            for asym in asyms.get(entity, []):
                valid[asym] = seq
    if not valid:
        raise InputError("no protein chain in this mmCIF file", path=path)
    start = {asym: min(num for _, num in seq) for asym, seq in valid.items()}

    tags = ["group_PDB", "label_atom_id", "label_alt_id", "label_comp_id", "label_asym_id",
            "label_seq_id", "pdbx_PDB_ins_code", "Cartn_x", "Cartn_y", "Cartn_z", "occupancy",
            "auth_seq_id", "auth_asym_id", "pdbx_PDB_model_num"]
    rows = _loop(block, "_atom_site.", tags)
    if not rows:
        raise InputError("no _atom_site coordinates", path=path)
    label_to_author: dict[str, str] = {}
    mapping: dict[str, dict[int, tuple]] = {}
    occupancy: dict[tuple, float] = {}
    first_model = rows[0][-1]            # AF2 / Biopython read the first model, whatever its number
    for row, (group, atom, alt, comp, asym, seq, icode, x, y, z, occ, auth_seq, auth_asym,
              model) in enumerate(rows, 1):
        if model != first_model:
            continue
        num = functools.partial(_number, category="_atom_site.", path=path, row=row)
        label_to_author[asym] = auth_asym
        het = " "
        if group == "HETATM":
            het = "W" if comp in ("HOH", "WAT") else "H_" + comp
        icode = " " if icode in ("?", ".") else icode
        key = (auth_asym, het, num(auth_seq, int, tag="auth_seq_id"), icode)
        if asym in valid:
            mapping.setdefault(auth_asym, {})[num(seq, int, tag="label_seq_id")
                                              - start[asym]] = key
        atoms = out.atoms.setdefault(key, {"__name__": comp})
        o = num(occ, float, tag="occupancy") if occ not in ("?", ".") else 1.0
        if atom not in atoms or o > occupancy[key + (atom,)]:   # ties: the first one stays
            atoms[atom] = tuple(num(v, float, tag=f"Cartn_{a}")
                                for v, a in ((x, "x"), (y, "y"), (z, "z")))
            occupancy[key + (atom,)] = o
    for asym, seq in valid.items():
        author = label_to_author.get(asym)
        if author is None:
            continue
        current = mapping.setdefault(author, {})
        out.seqres_to_structure[author] = [current.get(i) for i in range(len(seq))]
        out.chain_to_seqres[author] = "".join(_one_letter(mon) for mon, _ in seq)
    return out


def atom_positions(structure: TemplateStructure, chain: str) -> tuple[np.ndarray, np.ndarray]:
    """atom37 positions [N, 37, 3] and mask [N, 37] of `chain`'s seqres residues (AF2
    `_get_atom_positions`); raises ValueError for a CA-CA jump over 150 Å."""
    keys = structure.seqres_to_structure[chain]
    pos = np.zeros((len(keys), ATOM37, 3), np.float32)
    mask = np.zeros((len(keys), ATOM37), np.float32)
    cd, nh1, nh2 = (rc.ATOM_ORDER[a] for a in ("CD", "NH1", "NH2"))
    for i, key in enumerate(keys):
        if key is None:
            continue
        atoms = structure.atoms[key]
        resname = atoms["__name__"]
        for name, xyz in atoms.items():
            if name in rc.ATOM_ORDER:
                pos[i, rc.ATOM_ORDER[name]], mask[i, rc.ATOM_ORDER[name]] = xyz, 1.0
            elif name.upper() == "SE" and resname == "MSE":
                pos[i, rc.ATOM_ORDER["SD"]], mask[i, rc.ATOM_ORDER["SD"]] = xyz, 1.0
        if resname == "ARG" and mask[i, [cd, nh1, nh2]].all() and \
                np.linalg.norm(pos[i, nh1] - pos[i, cd]) > np.linalg.norm(pos[i, nh2] - pos[i, cd]):
            pos[i, [nh1, nh2]] = pos[i, [nh2, nh1]]
    ca = rc.ATOM_ORDER["CA"]
    prev = None
    for i in range(len(keys)):
        if mask[i, ca]:
            if prev is not None and np.linalg.norm(pos[i, ca] - pos[prev, ca]) > MAX_CA_CA_DISTANCE:
                raise ValueError(f"CA-CA distance between residues {prev} and {i} > "
                                 f"{MAX_CA_CA_DISTANCE} Å")
            prev = i
        else:
            prev = None
    return pos, mask
