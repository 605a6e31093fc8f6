"""AlphaFold-Multimer losses (protdp.model.multimer.losses, protdp.model.multimer.crop_permutation)
against explicit computations on hand-built toy complexes (FAPE split by chain pair, the chain
centre-of-mass term, clashes across chains), the crop-aware chain permutation against brute
force and the whole-chain alignment, and the homomer chain-swap invariance of the total loss
with the fixture-shaped multimer model."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from complex_fixtures import GOOD_ROWS, import_fixture_model, write_manifest
from protdp.data import residue_constants as rc
from protdp.data.atoms import read_structure
from protdp.data.parse import parse_structure
from protdp.metrics import rmsd_ca
from protdp.model.all_atom import atom37_to_atom14
from protdp.model.multimer.losses import (CHAIN_CENTRE_WEIGHT, INTERFACE_FAPE, INTRA_CHAIN_FAPE,
                                         chain_centre_loss, complex_backbone_fape, complex_loss,
                                         pair_masked_fape)
from protdp.model.multimer.crop_permutation import align_cropped_chains
from protdp.model.multimer.permutation import align_chain_permutation
from protdp.model.rigid import Rigid
from protdp.model.violations import violation_loss, within_residue_loss
from protdp.paths import data_root


def _rotations(rng, n):
    q = torch.tensor(rng.normal(size=(n, 4)))
    q = q / q.norm(dim=-1, keepdim=True)
    a, b, c, d = q.unbind(-1)
    return torch.stack([a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c),
                        2 * (b * c + a * d), a * a - b * b + c * c - d * d, 2 * (c * d - a * b),
                        2 * (b * d - a * c), 2 * (c * d + a * b), a * a - b * b - c * c + d * d],
                       -1).reshape(n, 3, 3)


def _fape_reference(pr, pt, tr, tt, mask, pair, clamp, scale, eps=1e-4):
    """Algorithm 28 written out pair by pair in float64."""
    num = den = 0.0
    for i in range(len(pt)):
        for j in range(len(pt)):
            w = mask[i] * mask[j] * pair[i, j]
            if not w:
                continue
            lp = pr[i].T @ (pt[j] - pt[i])
            lt = tr[i].T @ (tt[j] - tt[i])
            d = min(np.sqrt(((lp - lt) ** 2).sum() + eps), clamp)
            num, den = num + w * d / scale, den + w
    return num / (den + eps)


def test_pair_masked_fape_equals_algorithm_28_written_out():
    rng = np.random.default_rng(0)
    L = 9
    pr, tr = _rotations(rng, L), _rotations(rng, L)
    pt, tt = torch.tensor(rng.normal(size=(L, 3)) * 15), torch.tensor(rng.normal(size=(L, 3)) * 15)
    mask = torch.tensor((rng.random(L) > 0.2).astype(float))
    pair = torch.tensor((rng.random((L, L)) > 0.5).astype(float))
    for clamp, scale in (INTRA_CHAIN_FAPE, INTERFACE_FAPE):
        got = pair_masked_fape(Rigid(pr, pt), Rigid(tr, tt), mask, pt, tt, mask, pair, clamp, scale)
        want = _fape_reference(pr.numpy(), pt.numpy(), tr.numpy(), tt.numpy(), mask.numpy(),
                               pair.numpy(), clamp, scale)
        assert abs(float(got) - want) < 1e-10


@pytest.mark.parametrize("shift,interface", [(10.0, np.sqrt(100 + 1e-4) / 20), (50.0, 30 / 20)])
def test_rigidly_shifted_chain_costs_only_interface_fape(shift, interface):
    """Chain B moved by `shift` Å as a rigid body: every intra-chain pair is exact, every
    inter-chain pair is off by exactly `shift` (clamped at 30 Å, scale 20 Å)."""
    rng = np.random.default_rng(1)
    L, asym = 10, torch.tensor([1] * 6 + [2] * 4)
    rot, trans = _rotations(rng, L), torch.tensor(rng.normal(size=(L, 3)) * 10)
    moved = trans + torch.tensor([shift, 0, 0]) * (asym == 2)[:, None]
    traj = torch.zeros(2, L, 4, 4, dtype=torch.float64)
    traj[..., :3, :3], traj[..., :3, 3], traj[..., 3, 3] = rot, moved, 1.0
    truth = {"frames": Rigid(rot[:, None].expand(L, 8, 3, 3), trans[:, None].expand(L, 8, 3)),
             "backbone_mask": torch.ones(L, dtype=torch.float64)}
    intra, inter = complex_backbone_fape(traj, truth, asym)
    n_intra, n_inter = 6 * 6 + 4 * 4, 2 * 6 * 4
    assert float(intra) == pytest.approx(np.sqrt(1e-4) / 10 * n_intra / (n_intra + 1e-4), abs=1e-12)
    assert float(inter) == pytest.approx(interface * n_inter / (n_inter + 1e-4), rel=1e-9)


def test_chain_centre_term_pulls_apart_chains_predicted_too_close():
    asym = torch.tensor([1, 1, 2, 2])
    true = torch.tensor([[0.0, 0, 0], [0, 2, 0], [20, 0, 0], [20, 2, 0]], dtype=torch.float64)
    mask = torch.ones(4, dtype=torch.float64)
    for d_pred, want in ((10.0, (0.05 * (10 - 20 + 4)) ** 2 * 2 / 4), (18.0, 0.0), (30.0, 0.0)):
        pred = true.clone()
        pred[2:, 0] = d_pred
        assert float(chain_centre_loss(pred, true, mask, asym)) == pytest.approx(want, abs=1e-9)
    assert CHAIN_CENTRE_WEIGHT == 0.05


def _one_residue(k: int):
    """(aatype, atom14 positions) of residue k of 2q2k chain A (real coordinates)."""
    path = data_root() / "structures/2q2k.cif"
    chain = parse_structure(path, "A", data=read_structure(path))
    obs = np.nonzero(chain.all_atom_mask[:, 1])[0]
    i = obs[k]
    aatype = torch.tensor([rc.RESTYPES.index(chain.sequence[i])])
    pos14 = atom37_to_atom14(torch.tensor(chain.all_atom_positions[i:i + 1], dtype=torch.float64),
                             aatype)
    return aatype, pos14


def test_violations_count_clashes_across_chains_and_no_bond_between_chains():
    aatype, a = _one_residue(3)
    b = a + torch.tensor([2.5, 0.0, 0.0])                     # a copy overlapping chain A
    pos = torch.cat([a, b])                                    # [2, 14, 3]
    aa = torch.cat([aatype, aatype])
    exists = torch.tensor(rc.RESTYPE_ATOM14_MASK[aa.numpy()], dtype=torch.float64)
    radius = torch.tensor(rc.RESTYPE_ATOM14_RADIUS[aa.numpy()], dtype=torch.float64)
    inter = 0.0                                                # every atom pair across chains
    for i in range(14):
        for j in range(14):
            if exists[0, i] and exists[1, j]:
                d = torch.sqrt(((pos[0, i] - pos[1, j]) ** 2).sum() + 1e-10)
                inter += float(torch.relu(radius[0, i] + radius[1, j] - 1.5 - d))
    within = float(within_residue_loss(pos, exists, aa).sum())
    n_atoms = 1e-6 + float(exists.sum())                      # AF2's denominator
    want = (within + 2 * inter) / n_atoms
    assert inter > 1.0                                         # the copies do clash

    from protdp.model.multimer.losses import CHAIN_INDEX_OFFSET
    asym = torch.tensor([1, 2])
    ridx = torch.tensor([0, 0])                                # both chains start at 0
    got = violation_loss(pos, aa, ridx + CHAIN_INDEX_OFFSET * asym, torch.ones(2))
    assert float(got) == pytest.approx(want, rel=1e-9)
    raw = violation_loss(pos, aa, ridx, torch.ones(2))         # the monomer reading misses it
    assert float(raw) < want - 0.5 * 2 * inter / n_atoms
    # chain A ends at index 5, chain B starts at 6, far apart: no peptide bond between them
    far = torch.cat([a, a + torch.tensor([40.0, 0, 0])])
    apart = violation_loss(far, aa, torch.tensor([5, 6]) + CHAIN_INDEX_OFFSET * asym, torch.ones(2))
    bonded = violation_loss(far, aa, torch.tensor([5, 6]), torch.ones(2))
    assert float(apart) == pytest.approx(within / n_atoms, rel=1e-9)
    assert float(bonded) > float(apart) + 1.0


def _complex(rng, layout, n=None):
    asym = np.concatenate([[k + 1] * n for k, (_, n) in enumerate(layout)])
    entity = np.concatenate([[e] * n for e, n in layout])
    steps = rng.normal(size=(len(asym), 3))
    steps *= 3.8 / np.linalg.norm(steps, axis=1, keepdims=True)
    ca = np.concatenate([np.cumsum(steps[asym == k + 1], 0) + rng.normal(size=3) * 25
                         for k in range(len(layout))])
    return ca, asym, entity


def test_crop_alignment_equals_whole_chain_alignment_without_a_crop():
    rng = np.random.default_rng(2)
    for layout in ([(1, 12), (1, 12), (2, 9)], [(1, 8), (2, 10), (1, 8), (2, 10)]):
        true, asym, entity = _complex(rng, layout)
        pred = true + rng.normal(size=true.shape) * 3
        mask = (rng.random(len(true)) > 0.1).astype(float)
        pos = np.concatenate([np.arange(n) for _, n in layout])
        ours = align_cropped_chains(pred, asym, entity, pos, true, mask, asym, entity)
        ref = align_chain_permutation(pred, true, mask, asym, entity)
        assert ours.mapping == ref.mapping
        np.testing.assert_array_equal(ours.index, ref.index)


def test_crop_alignment_matches_brute_force_on_cropped_homomers():
    rng = np.random.default_rng(3)
    layout = [(1, 15), (1, 15), (1, 15), (2, 10)]
    for trial in range(6):
        true, asym_f, ent_f = _complex(rng, layout)
        mask = (rng.random(len(true)) > 0.1).astype(float)
        starts = {a: int(np.argmax(asym_f == a)) for a in (1, 2, 3, 4)}
        # crop: a window of each chain (different windows per copy)
        keep = []
        for a, (_, n) in zip((1, 2, 3, 4), layout):
            s = int(rng.integers(0, n - 8 + 1))
            keep += list(range(starts[a] + s, starts[a] + s + 8))
        keep = np.array(keep)
        asym, ent = asym_f[keep], ent_f[keep]
        pos = keep - np.array([starts[a] for a in asym])
        # the prediction: chains of entity 1 shuffled, noisy, moved
        perm = dict(zip((1, 2, 3), rng.permutation([1, 2, 3]).tolist()))
        perm[4] = 4
        src = np.array([starts[perm[a]] + p for a, p in zip(asym, pos)])
        pred = true[src] + rng.normal(size=(len(keep), 3)) * 0.5
        got = align_cropped_chains(pred, asym, ent, pos, true, mask, asym_f, ent_f)
        best = None
        for p in itertools.permutations((1, 2, 3)):
            m = {1: p[0], 2: p[1], 3: p[2], 4: 4}
            idx = np.array([starts[m[a]] + q for a, q in zip(asym, pos)])
            r = rmsd_ca(pred, true[idx], mask[idx])
            best = (r, m) if best is None or r < best[0] else best
        assert got.mapping == best[1] == perm, (trial, got.mapping, best, perm)


@pytest.fixture(scope="module")
def homodimer(tmp_path_factory):
    from protdp.complex.store import ComplexStore, build_complex_store
    from protdp.complex.training import complex_example
    from protdp.train.complex import TrainableMultimer, read_multimer_checkpoint

    d = tmp_path_factory.mktemp("homo")
    build_complex_store(write_manifest(d / "m.tsv", GOOD_ROWS[4:]), d / "c.h5")
    cfg, state = read_multimer_checkpoint(import_fixture_model(d / "mm"))
    model = TrainableMultimer(cfg)
    model.load_state_dict(state)
    rec = ComplexStore(d / "c.h5").read("2q2k")
    for seed in range(50):        # a crop with resolved residues of both chains
        x = complex_example(rec, 40, seed=seed, max_rows_per_chain=8)
        ca = x["all_atom_mask"][:, 1] > 0
        if min((ca & (x["asym_id"] == a)).sum() for a in (1, 2)) >= 5:
            break
    batch = {k: torch.as_tensor(np.asarray(v)) for k, v in x.items() if k != "crop_mode"}
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.eval()(batch, num_recycles=0, generator=torch.Generator().manual_seed(0))
    return cfg, batch, out


def test_homomer_chain_swap_leaves_the_loss_unchanged(homodimer):
    cfg, batch, out = homodimer
    L = batch["true_asym_id"].shape[0] // 2
    swap = torch.cat([torch.arange(L, 2 * L), torch.arange(L)])
    swapped = dict(batch)
    for k in ("true_all_atom_positions", "true_all_atom_mask"):
        swapped[k] = batch[k][swap]
    total, terms = complex_loss(out, batch, cfg)
    total_s, terms_s = complex_loss(out, swapped, cfg)
    assert torch.isfinite(total) and float(terms["interface_fape"]) > 0
    assert float(total_s) == pytest.approx(float(total), rel=1e-6)
    for k in terms:
        assert float(terms_s[k]) == pytest.approx(float(terms[k]), rel=1e-6, abs=1e-9), k
    # without the permutation (no whole-complex truth) the swapped truth costs more
    plain = {k: v for k, v in batch.items() if not k.startswith("true_")}
    crop_swapped = dict(plain)
    idx = [(int(a) % 2) * L + int(r) for a, r in zip(batch["asym_id"], batch["residue_index"])]
    crop_swapped["all_atom_positions"] = batch["true_all_atom_positions"][idx]
    crop_swapped["all_atom_mask"] = batch["true_all_atom_mask"][idx]
    assert abs(float(complex_loss(out, crop_swapped, cfg)[0]) - float(total)) > 1e-3
