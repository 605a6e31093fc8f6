"""Structural violations of a protein model, as AlphaFold's relaxation checks them
(AF2 supplement 1.9.11 `between_residue_clash_loss` / `between_residue_bond_loss`, Algorithm
"structural violations"), on heavy atoms read with gemmi:

- clash: two heavy atoms of different residues (not the peptide bond's C-N) closer than the
  sum of their van der Waals radii minus the 1.5 Å tolerance;
- peptide-bond violation: C(i)-N(i+1) length outside 1.329 ± 12 σ (σ = 0.014 Å, Engh & Huber,
  the values AlphaFold's `residue_constants` uses).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# van der Waals radii (Å) of the heavy elements, as AlphaFold's residue_constants.van_der_waals_radius
VDW_RADIUS = {"C": 1.7, "N": 1.55, "O": 1.52, "S": 1.8}
CLASH_TOLERANCE = 1.5          # Å (AF2 clash_overlap_tolerance)
PEPTIDE_C_N = 1.329            # Å
PEPTIDE_C_N_STDDEV = 0.014     # Å
VIOLATION_SIGMAS = 12.0        # AF2 violation_tolerance_factor


def _model_heavy_atoms(path: str | Path):
    """heavy_atoms plus the residue indices that start a chain (a set)."""
    import gemmi
    st = gemmi.read_structure(str(path))
    st.remove_hydrogens()
    xyz, el, res, names, chain_starts = [], [], [], [], set()
    i = 0
    for chain in st[0]:
        chain_starts.add(i)
        for r in chain:
            for a in r:
                xyz.append(a.pos.tolist())
                el.append(a.element.name.upper())
                res.append(i)
                names.append(a.name)
            i += 1
    return (np.asarray(xyz).reshape(-1, 3), np.asarray(el), np.asarray(res, int),
            np.asarray(names), chain_starts)


def heavy_atoms(path: str | Path):
    """(coords [N, 3], element [N], residue index [N], atom name [N]) of every chain of model 1;
    residues are numbered 0.. over the chains in file order (OpenMM's `residue.index`, which
    the relaxation's violation loop excludes), so a complex is checked whole."""
    return _model_heavy_atoms(path)[:4]


def structure_violations(path: str | Path) -> dict:
    """{'clashes': n, 'bond_violations': n, 'violating_residues': [0-based residue indices]}."""
    from scipy.spatial import cKDTree
    xyz, el, res, names, chain_starts = _model_heavy_atoms(path)
    radius = np.array([VDW_RADIUS.get(e, 1.7) for e in el])
    pairs = cKDTree(xyz).query_pairs(2 * max(VDW_RADIUS.values()) - CLASH_TOLERANCE, output_type="ndarray")
    bad = set()
    clashes = 0
    for i, j in pairs:
        if res[i] == res[j] or names[i] == names[j] == "SG":   # same residue / disulfide
            continue
        peptide = (abs(int(res[i]) - int(res[j])) == 1
                   and max(int(res[i]), int(res[j])) not in chain_starts
                   and {names[i], names[j]} <= {"C", "N", "CA", "O"})
        if peptide:
            continue   # bonded neighbours' backbone: covered by the bond check
        if np.linalg.norm(xyz[i] - xyz[j]) < radius[i] + radius[j] - CLASH_TOLERANCE:
            clashes += 1
            bad.update((int(res[i]), int(res[j])))
    bonds = 0
    n_res = int(res.max()) + 1 if len(res) else 0
    for r in range(n_res - 1):
        if r + 1 in chain_starts:          # no peptide bond between two chains
            continue
        c = np.nonzero((res == r) & (names == "C"))[0]
        n = np.nonzero((res == r + 1) & (names == "N"))[0]
        if len(c) and len(n):
            d = float(np.linalg.norm(xyz[c[0]] - xyz[n[0]]))
            if abs(d - PEPTIDE_C_N) > VIOLATION_SIGMAS * PEPTIDE_C_N_STDDEV:
                bonds += 1
                bad.update((r, r + 1))
    return {"clashes": clashes, "bond_violations": bonds, "violating_residues": sorted(bad)}
