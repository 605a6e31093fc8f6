"""Multi-chain permutation alignment (protdp.model.multimer.permutation) against brute force:
over every permutation of ground-truth chains within entities, the one with the lowest Cα RMSD
after optimal superposition of the whole complex (Kabsch, protdp.metrics)."""

from __future__ import annotations

import itertools

import numpy as np

from protdp.metrics import rmsd_ca
from protdp.model.multimer.permutation import align_chain_permutation


def _random_rotation(rng):
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _chain_walk(rng, n, start):
    steps = rng.normal(size=(n, 3))
    steps *= 3.8 / np.linalg.norm(steps, axis=1, keepdims=True)
    return start + np.cumsum(steps, axis=0)


def _brute_force(pred, true, mask, asym, entity):
    chains = {int(a): np.nonzero(asym == a)[0] for a in np.unique(asym)}
    ent = {a: int(entity[p[0]]) for a, p in chains.items()}
    groups = {}
    for a in chains:
        groups.setdefault(ent[a], []).append(a)
    best = None
    for perms in itertools.product(*[itertools.permutations(g) for g in groups.values()]):
        mapping = {}
        for g, perm in zip(groups.values(), perms):
            mapping.update(dict(zip(g, perm)))
        index = np.arange(len(pred))
        for p, q in mapping.items():
            index[chains[p]] = chains[q]
        r = rmsd_ca(pred, true[index], mask[index])
        if best is None or r < best[0] - 1e-9:
            best = (r, mapping)
    return best


def _complex(rng, layout):
    """layout: list of (entity, length); chains placed ~25 Å apart."""
    asym = np.concatenate([[k + 1] * n for k, (_, n) in enumerate(layout)])
    entity = np.concatenate([[e] * n for e, n in layout])
    ca = np.concatenate([_chain_walk(rng, n, rng.normal(size=3) * 25) for _, n in layout])
    return ca, asym, entity


def test_swapped_homodimer_is_unswapped():
    rng = np.random.default_rng(0)
    pred, asym, entity = _complex(rng, [(1, 20), (1, 20)])
    swap = np.concatenate([np.arange(20, 40), np.arange(0, 20)])
    rot, t = _random_rotation(rng), rng.normal(size=3) * 10
    true = pred[swap] @ rot.T + t                       # ground truth lists chain B first
    perm = align_chain_permutation(pred, true, np.ones(40), asym, entity)
    assert perm.mapping == {1: 2, 2: 1} and perm.rmsd < 1e-6
    assert np.allclose(perm.apply(true), pred @ rot.T + t)


def test_matches_brute_force_on_noisy_heteromers():
    rng = np.random.default_rng(1)
    for layout in ([(1, 12), (1, 12), (2, 9)], [(1, 8), (2, 10), (1, 8), (2, 10), (1, 8)],
                   [(1, 15), (2, 7)]):
        for _ in range(3):
            pred, asym, entity = _complex(rng, layout)
            mask = (rng.random(len(pred)) > 0.15).astype(float)
            # ground truth: a random within-entity shuffle of the noisy prediction, moved
            chains = {int(a): np.nonzero(asym == a)[0] for a in np.unique(asym)}
            index = np.arange(len(pred))
            for e in np.unique(entity):
                same = [a for a in chains if entity[chains[a][0]] == e]
                for a, b in zip(same, rng.permutation(same)):
                    index[chains[a]] = chains[int(b)]
            noisy = pred + rng.normal(size=pred.shape) * 1.0
            true = np.empty_like(noisy)
            true[index] = noisy
            true = true @ _random_rotation(rng).T + rng.normal(size=3) * 30
            mask_true = np.empty_like(mask)
            mask_true[index] = mask
            perm = align_chain_permutation(pred, true, mask_true, asym, entity)
            ref_rmsd, ref_map = _brute_force(pred, true, mask_true, asym, entity)
            assert perm.mapping == ref_map, (layout, perm.mapping, ref_map)
            assert rmsd_ca(pred, perm.apply(true), perm.apply(mask_true)) <= ref_rmsd + 1e-9


def test_all_distinct_entities_keep_their_order():
    rng = np.random.default_rng(2)
    pred, asym, entity = _complex(rng, [(1, 10), (2, 11), (3, 12)])
    perm = align_chain_permutation(pred, pred + 0.5, np.ones(len(pred)), asym, entity)
    assert perm.mapping == {1: 1, 2: 2, 3: 3}
    assert np.array_equal(perm.index, np.arange(len(pred)))
