"""Outputs of a predicted complex: one PDB and one mmCIF with every chain, and the confidence
JSON with chain boundaries.

Structures follow AlphaFold's convention (AF2 `protein.to_pdb`, as `protdp predict` writes a
monomer): all heavy atoms in atom37 order, each with its residue's pLDDT (2 decimals) as the
B-factor, residues numbered from 1 within each chain. Chains are named with the complex's
chain ids (the FASTA order, `protdp.complex.inputs`), listed in the model's residue order
(AlphaFold's assembly order: copies of one sequence side by side). The JSON holds the PAE over
the whole complex with each chain's [start, end) residue range, pTM, ipTM, ranking confidence,
the chain-pair ipTM matrix and the interface PAE (`protdp.model.multimer.heads`).
Files are written to a temporary name and renamed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from Bio.PDB.StructureBuilder import StructureBuilder

from protdp.data.residue_constants import ATOM_TYPES, NUM_ATOM37, ONE_TO_THREE, \
    RESTYPE_ATOM37_MASK
from protdp.data.residues import sequence_to_ids
from protdp.data.safeio import atomic_write_text, save_structure


def chain_ranges(chains: list[tuple[str, str]]) -> list[dict]:
    """[(chain id, sequence)] in residue order -> [{chain_id, start, end, length}] (end
    exclusive, 0-based residue positions of the complex)."""
    out, start = [], 0
    for cid, seq in chains:
        out.append({"chain_id": cid, "start": start, "end": start + len(seq),
                    "length": len(seq)})
        start += len(seq)
    return out


def _structure(name, chains, positions, mask, bfactor):
    sb = StructureBuilder()
    sb.init_structure(name)
    sb.init_model(0)
    for r in chain_ranges(chains):
        sb.init_chain(r["chain_id"])
        sb.init_seg("    ")
        seq = dict(chains)[r["chain_id"]]
        for k, i in enumerate(range(r["start"], r["end"])):
            sb.init_residue(ONE_TO_THREE.get(seq[k], "UNK"), " ", k + 1, " ")
            for a in np.nonzero(mask[i] > 0)[0]:
                atom = ATOM_TYPES[a]
                sb.init_atom(atom, positions[i, a], float(bfactor[i]), 1.0, " ",
                             atom.ljust(3).rjust(4) if len(atom) < 4 else atom,
                             element=atom[0])
    return sb.get_structure()


def write_complex_structures(directory: str | Path, name: str, chains: list[tuple[str, str]],
                             positions: np.ndarray, plddt: np.ndarray,
                             mask: np.ndarray | None = None,
                             kinds: tuple[str, ...] = ("pdb", "cif")) -> dict[str, Path]:
    """`<name>.pdb` and `<name>.cif` (those of `kinds`) of the whole complex. positions
    [L, 37, 3] Å, plddt [L], mask [L, 37] (default: the atoms each residue type has)."""
    if len({c for c, _ in chains}) != len(chains):
        raise ValueError("chain ids must be unique")
    seq = "".join(s for _, s in chains)
    positions = np.asarray(positions, np.float64)
    if positions.shape != (len(seq), NUM_ATOM37, 3):
        raise ValueError(f"positions shape {positions.shape} != ({len(seq)}, {NUM_ATOM37}, 3)")
    mask = RESTYPE_ATOM37_MASK[sequence_to_ids(seq)] if mask is None else np.asarray(mask)
    if not np.all(np.isfinite(positions[mask > 0])):
        raise ValueError("cannot write non-finite coordinates")
    structure = _structure(name, chains, positions, mask,
                           np.round(np.asarray(plddt, np.float64), 2))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return save_structure(structure, directory, name, kinds)


def _plain(x):
    """numpy / torch values -> JSON (non-finite -> null)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return [_plain(v) for v in x.tolist()] if x.ndim else _plain(x.item())
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _round(v, digits: int):
    """round() that keeps null (a non-finite value, `_plain`) null."""
    return None if v is None else round(v, digits)


def confidence_json(chains: list[tuple[str, str]], plddt, confidence: dict, *,
                    with_pae: bool = True) -> dict:
    """The scores of a complex (`complex_confidence` output + pLDDT) with chain ranges; the
    chain-pair matrices are keyed by chain id. Non-finite values (a diverged model's NaN
    outputs, which the gate routes as invalid_plddt) are null, never a crash. `with_pae=False`:
    without the [L, L] "pae" (rounded one value at a time here), for callers that drop it."""
    ids = [c for c, _ in chains]

    def by_chain(m):
        m = _plain(m)
        return {a: {b: _round(m[i][j], 4) for j, b in enumerate(ids)} for i, a in enumerate(ids)}

    per_residue = _plain(plddt)
    finite = [v for v in per_residue if v is not None]
    doc = {"chains": chain_ranges(chains),
           "plddt": [_round(v, 2) for v in per_residue],
           "mean_plddt": round(float(np.mean(finite)), 2)
           if finite and len(finite) == len(per_residue) else None,
           "ptm": _round(_plain(confidence["ptm"]), 4),
           "iptm": _round(_plain(confidence["iptm"]), 4),
           "ranking_confidence": _round(_plain(confidence["ranking_confidence"]), 4),
           "chain_pair_iptm": by_chain(confidence["chain_pair_iptm"]),
           "interface_pae": _round(_plain(confidence["interface_pae"]), 2),
           "chain_pair_pae": by_chain(confidence["chain_pair_pae"])}
    if with_pae:
        doc["pae"] = [[_round(v, 2) for v in row] for row in _plain(confidence["pae"])]
    return doc


def write_confidence_json(path: str | Path, chains, plddt, confidence: dict) -> Path:
    path = Path(path)
    atomic_write_text(path, json.dumps(confidence_json(chains, plddt, confidence),
                                       allow_nan=False) + "\n")
    return path
