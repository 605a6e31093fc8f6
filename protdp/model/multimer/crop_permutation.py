"""Multi-chain permutation alignment on a CROPPED complex (AlphaFold-Multimer, Evans et al. 2021,
§7.3; OpenFold's `multi_chain_permutation_align` also matches the crop against the full ground
truth): the same anchor-and-greedy procedure as `protdp.model.multimer.permutation` (which
needs whole chains of equal length), but a predicted chain p of the crop is compared with
ground-truth chain q of its entity at the SAME sequence positions: the truth of p under q is
`full[start(q) + chain_position]`, where `chain_position` is each cropped residue's position in
its chain. Chains of one entity share a sequence, so these residues are the same residue types.

1. Anchor: the entity with the fewest copies in the full complex, ties -> longest chain, then
   lowest entity id; its ground-truth anchor is the copy with the most resolved Cα.
2. For every predicted chain of the anchor entity present in the crop: Kabsch of the anchor's
   truth (at p's positions) onto the prediction; then predicted chains in asym order each take
   the unassigned same-entity truth chain whose resolved-Cα centroid (at p's positions) is
   nearest to p's.
3. Keep the assignment with the lowest Cα RMSD over the crop under that superposition.
A crop holding no anchor-entity chain with 3 resolved Cα keeps the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protdp.metrics import kabsch

MIN_ANCHOR_RESIDUES = 3


@dataclass
class CropPermutation:
    mapping: dict[int, int]        # predicted chain (asym id) -> ground-truth chain (asym id)
    index: np.ndarray              # int [L_crop]: full ground-truth residue for each position
    rmsd: float                    # Cα RMSD under the chosen superposition (nan: identity kept)


def _blocks(asym: np.ndarray) -> dict[int, np.ndarray]:
    return {int(a): np.nonzero(asym == a)[0] for a in np.unique(asym)}


def align_cropped_chains(pred_ca, asym_id, entity_id, chain_position, true_ca_full,
                         true_mask_full, asym_full, entity_full) -> CropPermutation:
    """pred_ca [L, 3], asym_id / entity_id / chain_position [L] of the crop; true_ca_full
    [Lf, 3], true_mask_full [Lf] (resolved Cα), asym_full / entity_full [Lf] of the whole
    complex (chains contiguous) -> the permutation (module docstring)."""
    pred = np.asarray(pred_ca, np.float64)
    asym, pos = np.asarray(asym_id).astype(int), np.asarray(chain_position).astype(int)
    true, tmask = np.asarray(true_ca_full, np.float64), np.asarray(true_mask_full, np.float64)
    full = _blocks(np.asarray(asym_full).astype(int))
    ent_full = {a: int(np.asarray(entity_full)[idx[0]]) for a, idx in full.items()}
    crop = _blocks(asym)
    ent_of_pred = {a: int(np.asarray(entity_id)[idx[0]]) for a, idx in crop.items()}
    by_entity: dict[int, list[int]] = {}
    for a, e in ent_full.items():
        by_entity.setdefault(e, []).append(a)

    def index_for(mapping: dict[int, int]) -> np.ndarray:
        idx = np.empty(len(asym), int)
        for p, q in mapping.items():
            idx[crop[p]] = full[q][0] + pos[crop[p]]
        return idx

    identity = index_for({a: a for a in crop})
    anchor_entity = min(by_entity, key=lambda e: (len(by_entity[e]),
                                                  -len(full[by_entity[e][0]]), e))
    true_anchor = max(by_entity[anchor_entity], key=lambda a: (tmask[full[a]].sum(), -a))
    best = None
    for pa in sorted(a for a in crop if ent_of_pred[a] == anchor_entity):
        ta = full[true_anchor][0] + pos[crop[pa]]
        if tmask[ta].sum() < MIN_ANCHOR_RESIDUES:
            continue
        rot, t = kabsch(true[ta], pred[crop[pa]], tmask[ta])     # ground truth -> prediction
        moved = true @ rot.T + t
        mapping, free = {}, {e: list(v) for e, v in by_entity.items()}
        for p in sorted(crop):
            cands, dist = free[ent_of_pred[p]], []
            for q in cands:
                qq = full[q][0] + pos[crop[p]]
                m = tmask[qq]
                if m.sum() == 0:
                    dist.append(np.inf)
                    continue
                cp = (pred[crop[p]] * m[:, None]).sum(0) / m.sum()
                cq = (moved[qq] * m[:, None]).sum(0) / m.sum()
                dist.append(float(np.linalg.norm(cp - cq)))
            mapping[p] = cands.pop(int(np.argmin(dist)))
        idx = index_for(mapping)
        m = tmask[idx]
        rmsd = float(np.sqrt((((pred - moved[idx]) ** 2).sum(-1) * m).sum() / max(m.sum(), 1e-12)))
        if best is None or rmsd < best.rmsd:
            best = CropPermutation(mapping, idx, rmsd)
    return best if best is not None else CropPermutation({a: a for a in crop}, identity,
                                                         float("nan"))
