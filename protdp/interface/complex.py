"""Interface rows of one of protdp's own complex predictions, computed from exactly what the
prediction folder holds so that they equal ipsae.py's numbers on the ColabFold scores JSON and
the PDB written beside them: PAE and pLDDT rounded to 2 decimals (ColabFold's scores file),
coordinates to 3 (PDB), residues numbered from 1 in each chain, the Cβ (Cα for glycine) of the
atom37 layout as the distance atom. Each row also gets the pair's actifpTM when the model gave
one (`protdp.model.multimer.heads.chain_pair_actifptm`).
"""

from __future__ import annotations

import math

import numpy as np

from protdp.data.residue_constants import ATOM_TYPES, ONE_TO_THREE
from protdp.data.residues import RESTYPES
from protdp.interface.scores import (DEFAULT_DIST_CUTOFF, DEFAULT_PAE_CUTOFF, Residues,
                                     best_pair, interface_scores)

CA, CB = ATOM_TYPES.index("CA"), ATOM_TYPES.index("CB")


def complex_residues(chains: list[tuple[str, str]], positions: np.ndarray) -> Residues:
    """[(chain id, sequence)] in residue order, positions [L, 37, 3] Å -> Residues."""
    ids, names, numbers = [], [], []
    for cid, seq in chains:
        ids += [cid] * len(seq)
        names += [ONE_TO_THREE.get(a, "UNK") for a in seq]
        numbers += range(1, len(seq) + 1)
    names = np.array(names, dtype=str)
    positions = np.round(np.asarray(positions, np.float64), 3)
    cb = np.where((names == "GLY")[:, None], positions[:, CA], positions[:, CB])    # [L, 3]
    return Residues(np.array(ids, dtype=str), names, np.array(numbers, dtype=int), cb)


def complex_interface_rows(chains: list[tuple[str, str]], positions: np.ndarray,
                           plddt: np.ndarray, pae: np.ndarray,
                           actifptm: np.ndarray | None = None,
                           pae_cutoff: float = DEFAULT_PAE_CUTOFF,
                           dist_cutoff: float = DEFAULT_DIST_CUTOFF) -> list[dict]:
    """scores.json's `interface_scores`: positions [L, 37, 3], plddt [L], pae [L, L],
    actifptm [C, C] in `chains` order (or None); rows rounded to 6 decimals (ipsae.py's)."""
    res = complex_residues(chains, positions)
    rows = interface_scores(np.round(np.asarray(pae, np.float64), 2),
                            np.round(np.asarray(plddt, np.float64), 2), res, pae_cutoff,
                            dist_cutoff)
    order = [c for c, _ in chains]
    out = []
    for r in rows:
        r = {k: _json_number(v) for k, v in r.items()}
        if actifptm is not None:
            v = float(np.asarray(actifptm)[order.index(r["chain_1"]), order.index(r["chain_2"])])
            r["actifptm"] = round(v, 6) if math.isfinite(v) else None
        out.append(r)
    return out


def _json_number(v):
    """Floats to 6 decimals (ipsae.py's); non-finite (a diverged model's NaN) -> None."""
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else None
    return v


def best_interface(rows: list[dict]) -> dict | None:
    """The max row with the highest ipSAE, for summary.csv: {chain_1, chain_2, ipsae,
    pdockq2}; None without a pair with a numeric ipSAE."""
    best = best_pair([r for r in rows if r.get("ipsae") is not None])
    return None if best is None else {k: best[k] for k in ("chain_1", "chain_2", "ipsae",
                                                           "pdockq2")}


def chains_from_features(asym_id: np.ndarray, aatype: np.ndarray) -> list[tuple[str, str]]:
    """[(chain id A, B, ..., sequence)] of a complex's features: asym_id [L] (chains
    contiguous, in order), aatype [L] (AF2 residue ids; 20 and above -> X)."""
    letters = np.array(list(RESTYPES) + ["X"])[np.minimum(np.asarray(aatype), len(RESTYPES))]
    asym_id = np.asarray(asym_id)
    ids = list(dict.fromkeys(asym_id.tolist()))
    names = [chr(ord("A") + k) if k < 26 else f"C{k}" for k in range(len(ids))]
    return [(n, "".join(letters[asym_id == a])) for n, a in zip(names, ids)]


def weakest_pair_ipsae(rows) -> float | None:
    """The lowest max-row ipSAE of a complex's `interface_scores` rows (what the gate's
    low_ipsae tests; also of rows read back from a review queue, so anything that is not a
    row is skipped): None without max rows, NaN when a max row's ipSAE is not a finite number
    (unknown: never "accepted"; calibration counts it as incomplete)."""
    values = [r.get("ipsae") for r in rows or () if isinstance(r, dict) and r.get("type") == "max"]
    if not values:
        return None
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
           for v in values):
        return float("nan")
    return float(min(values))
