"""Multi-chain permutation alignment for training on complexes (AlphaFold-Multimer, Evans et al.
2021, §"Multi-chain permutation alignment"): copies of the same sequence (one entity) are
interchangeable, so before the losses the ground-truth chains are permuted within each
entity to match the prediction.

1. Anchor: the entity with the fewest copies (least ambiguous), ties -> longest chain, then
   lowest entity id; its ground-truth anchor chain is the copy with the most resolved
   residues.
2. For every predicted chain of the anchor entity: superpose the ground truth onto the
   prediction by Kabsch on the anchor pair's Cα (resolved residues), then assign chains
   greedily, predicted chains in asym order, each to the unassigned ground-truth copy of its
   entity whose resolved-Cα centroid is nearest.
3. Keep the assignment with the lowest Cα RMSD over the whole complex under that anchor's
   superposition.

Chains of one entity have the same length (the same sequence), so a permutation is a
reordering of whole chain blocks of the ground truth [L, ...] in the features' residue layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protdp.metrics import kabsch


@dataclass
class ChainPermutation:
    mapping: dict[int, int]        # predicted chain (asym id) -> ground-truth chain (asym id)
    index: np.ndarray              # int [L]: ground truth residue to place at each position
    rmsd: float                    # Cα RMSD under the anchor superposition (resolved residues)
    anchor: tuple[int, int]        # (predicted, ground-truth) anchor chains

    def apply(self, true: np.ndarray) -> np.ndarray:
        """Ground-truth per-residue array [L, ...] -> the same, chains permuted."""
        return np.asarray(true)[self.index]


def _chains(asym_id: np.ndarray, entity_id: np.ndarray) -> dict[int, tuple[int, np.ndarray]]:
    """asym id -> (entity id, residue positions)."""
    out = {}
    for a in np.unique(asym_id):
        pos = np.nonzero(asym_id == a)[0]
        out[int(a)] = (int(entity_id[pos[0]]), pos)
    return out


def _centroid(x: np.ndarray, mask: np.ndarray) -> np.ndarray | None:
    return None if mask.sum() == 0 else (x * mask[:, None]).sum(0) / mask.sum()


def align_chain_permutation(pred_ca, true_ca, true_mask, asym_id, entity_id) -> ChainPermutation:
    """pred_ca, true_ca [L, 3], true_mask [L] (resolved Cα), asym_id / entity_id [L] -> the
    permutation of ground-truth chains that best matches the prediction (module docstring)."""
    pred, true = np.asarray(pred_ca, np.float64), np.asarray(true_ca, np.float64)
    mask = np.asarray(true_mask, np.float64)
    chains = _chains(np.asarray(asym_id), np.asarray(entity_id))
    by_entity: dict[int, list[int]] = {}
    for a, (e, _) in chains.items():
        by_entity.setdefault(e, []).append(a)
    anchor_entity = min(by_entity, key=lambda e: (len(by_entity[e]),
                                                  -len(chains[by_entity[e][0]][1]), e))
    copies = by_entity[anchor_entity]
    true_anchor = max(copies, key=lambda a: (mask[chains[a][1]].sum(), -a))
    ta = chains[true_anchor][1]
    if mask[ta].sum() < 3:
        raise ValueError(f"anchor chain {true_anchor} has fewer than 3 resolved residues")
    best = None
    for pred_anchor in copies:
        pa = chains[pred_anchor][1]
        rot, t = kabsch(true[ta], pred[pa], mask[ta])          # ground truth -> prediction
        moved = true @ rot.T + t
        mapping, free = {}, {e: list(v) for e, v in by_entity.items()}
        for p in sorted(chains):
            e, pp = chains[p]
            dist = []
            for q in free[e]:
                qq = chains[q][1]
                cp, cq = _centroid(pred[pp], mask[qq]), _centroid(moved[qq], mask[qq])
                dist.append(np.inf if cp is None else float(np.linalg.norm(cp - cq)))
            q = free[e].pop(int(np.argmin(dist)))
            mapping[p] = q
        index = np.arange(len(pred))
        for p, q in mapping.items():
            index[chains[p][1]] = chains[q][1]
        m = mask[index]
        rmsd = float(np.sqrt((((pred - moved[index]) ** 2).sum(-1) * m).sum() / m.sum()))
        if best is None or rmsd < best.rmsd:
            best = ChainPermutation(mapping, index, rmsd, (pred_anchor, true_anchor))
    return best
