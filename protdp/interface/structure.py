"""Residue tokens of a predicted complex from its PDB or mmCIF file (gemmi), chosen as ipsae.py
chooses them so that the PAE rows line up:

* a residue is a token with a Cα (or an atom named C1', nucleotides); its distance atom is Cβ
  (Cα for glycine, C3' for nucleotides);
* ligand atoms (mmCIF: no label_seq_id; PDB: residue name LIG, as Boltz writes) are not
  residues; in AlphaFold 3 / Boltz PAE matrices every ligand atom and every atom of a modified
  residue (a name outside `STANDARD_RESIDUES`) is a token of its own, so `token_mask` marks
  which PAE rows are residues (1) and which are skipped (0), atom by atom in file order;
* the chain id is auth_asym_id (label_asym_id when absent); residue numbers are label_seq_id
  in mmCIF and the residue sequence number in PDB.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protdp.errors import InputError
from protdp.interface.inputs import MAX_INPUT_BYTES, read_input_bytes
from protdp.interface.scores import NUCLEIC_RESIDUES, Residues

STANDARD_RESIDUES = frozenset({
    "ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE", "LEU", "LYS", "MET",
    "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL"}) | NUCLEIC_RESIDUES
CIF_SUFFIXES = (".cif", ".mmcif", ".cif.gz", ".mmcif.gz")


@dataclass(frozen=True)
class StructureTokens:
    residues: Residues
    token_mask: np.ndarray       # [T] bool: PAE token is a residue (AF3 / Boltz token order)
    ca_serial: np.ndarray        # [N] atom serial - 1 of each residue's Cα (AF3 atom_plddts)
    cb_serial: np.ndarray        # [N] atom serial - 1 of each residue's distance atom
    chain_atoms: dict            # chain id -> number of atoms (a chain without residues shows)


def is_cif(path: str | Path) -> bool:
    return str(path).lower().endswith(CIF_SUFFIXES)


def _is_representative(name: str) -> bool:
    return name == "CA" or "C1" in name


def _is_distance_atom(name: str, resname: str) -> bool:
    return name == "CB" or "C3" in name or (resname == "GLY" and name == "CA")


def _read(path: Path, data: bytes):
    """The first model of the structure in `data` (the bytes of `path`; gzip when it ends .gz,
    inflated to at most `MAX_INPUT_BYTES`)."""
    import gemmi

    try:
        if str(path).lower().endswith(".gz"):
            data = _gunzip(data)
        fmt = gemmi.CoorFormat.Mmcif if is_cif(path) else gemmi.CoorFormat.Pdb
        st = gemmi.read_structure_string(data, merge_chain_parts=False, format=fmt)
    except (RuntimeError, ValueError, OSError, EOFError, zlib.error) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"not a readable PDB/mmCIF structure ({first})", path=path) from None
    if len(st) == 0:
        raise InputError("structure has no model", path=path)
    return st[0]


def _gunzip(data: bytes) -> bytes:
    """gzip `data` inflated, refusing more than `MAX_INPUT_BYTES` (a small bomb stays small)."""
    inflate = zlib.decompressobj(wbits=31)
    out = inflate.decompress(data, MAX_INPUT_BYTES + 1)
    if len(out) > MAX_INPUT_BYTES or inflate.unconsumed_tail:
        raise ValueError(f"inflates to over {MAX_INPUT_BYTES // 2**20} MiB")
    return out


def read_structure_tokens(path: str | Path, data: bytes | None = None) -> StructureTokens:
    """The residue tokens of the first model of a PDB / mmCIF file (`data`: its bytes, already
    read; else `path` is read, `read_input_bytes`)."""
    path = Path(path)
    cif = is_cif(path)
    data = read_input_bytes(path) if data is None else data
    chains, names, numbers, cb, ca_serial, cb_serial, mask = [], [], [], [], [], [], []
    chain_atoms: dict[str, int] = {}
    for chain in _read(path, data):
        chain_atoms.setdefault(chain.name, 0)
        for residue in chain:
            number = residue.label_seq if cif else residue.seqid.num
            ligand = number is None if cif else residue.name == "LIG"
            reps, dists = [], []
            for atom in residue:
                chain_atoms[chain.name] += 1
                if ligand:
                    mask.append(False)
                    continue
                if _is_representative(atom.name):
                    mask.append(True)
                    reps.append(atom)
                elif residue.name not in STANDARD_RESIDUES:
                    mask.append(False)
                if _is_distance_atom(atom.name, residue.name):
                    dists.append(atom)
            if ligand or (not reps and not dists):
                continue
            where = f"chain {chain.name} residue {residue.name} {residue.seqid.num}"
            if len(reps) != 1 or len(dists) != 1:
                raise InputError(f"{where}: expected one Cα (C1') and one Cβ (Cα for Gly, C3'"
                                 f") atom, found {len(reps)} and {len(dists)}", path=path)
            chains.append(chain.name)
            names.append(residue.name)
            numbers.append(int(number))
            cb.append(dists[0].pos.tolist())
            ca_serial.append(reps[0].serial - 1)
            cb_serial.append(dists[0].serial - 1)
    residues = Residues(np.array(chains, dtype=str), np.array(names, dtype=str),
                        np.array(numbers, dtype=int), np.array(cb, dtype=float).reshape(-1, 3))
    return StructureTokens(residues, np.array(mask, dtype=bool), np.array(ca_serial, int),
                           np.array(cb_serial, int), chain_atoms)
