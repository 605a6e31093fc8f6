"""lDDT-Cα, Kabsch RMSD and GDT-TS against hand-computed values."""

import math

import numpy as np
import pytest
import torch

from model_fixtures import one_thread  # noqa: F401

from protdp.metrics import gdt_ts, kabsch, lddt_ca, per_residue_lddt_ca, rmsd_ca, superpose


def _rotation(seed=0):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    return q * np.sign(np.linalg.det(q))


def _chain(n=30, seed=0):
    steps = np.random.default_rng(seed).normal(size=(n, 3))
    return np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=1, keepdims=True), axis=0)


def test_lddt_identity_and_rigid_invariance():
    x = _chain()
    assert lddt_ca(x, x) == pytest.approx(1.0)
    moved = x @ _rotation().T + np.array([5.0, -3.0, 2.0])
    assert lddt_ca(moved, x) == pytest.approx(1.0)
    assert lddt_ca(torch.tensor(moved), torch.tensor(x)) == pytest.approx(1.0)


def test_lddt_known_value_for_perturbed_structure():
    # 4 points on a line, 3 Å apart (all pairs < 15 Å); move the last by 0.7 Å along the line.
    true = np.array([[0.0, 0, 0], [3, 0, 0], [6, 0, 0], [9, 0, 0]])
    pred = true.copy()
    pred[3, 0] += 0.7
    # 6 ordered pairs touch point 3 with |dd| = 0.7 -> passes 1, 2, 4 Å -> 0.75; 6 others -> 1.
    assert lddt_ca(pred, true) == pytest.approx((6 * 1 + 6 * 0.75) / 12)
    per = per_residue_lddt_ca(pred, true)
    assert isinstance(per, np.ndarray)
    np.testing.assert_allclose(per, [(2 + 0.75) / 3] * 3 + [0.75], atol=1e-9)
    # 3 Å error: passes only the 4 Å threshold
    pred[3, 0] = 12.0
    assert lddt_ca(pred, true) == pytest.approx((6 * 1 + 6 * 0.25) / 12)


def test_lddt_inclusion_radius_is_taken_from_true_structure_and_mask():
    true = np.array([[0.0, 0, 0], [3, 0, 0], [40, 0, 0]])     # point 2 has no neighbours < 15 Å
    pred = np.array([[0.0, 0, 0], [3, 0, 0], [3.5, 0, 0]])    # ... even if the prediction puts it close
    assert lddt_ca(pred, true) == pytest.approx(1.0)
    pred2 = np.array([[0.0, 0, 0], [5, 0, 0], [40, 0, 0]])    # 2 Å error on the only scored pair
    assert lddt_ca(pred2, true) == pytest.approx(0.5)
    assert lddt_ca(pred2, true, mask=np.array([1.0, 0.0, 1.0])) == pytest.approx(1.0)  # no pairs
    per = per_residue_lddt_ca(torch.tensor(pred2), torch.tensor(true), torch.tensor([1.0, 1.0, 0.0]))
    assert isinstance(per, torch.Tensor) and per[2] == 0


def test_kabsch_rmsd_of_rotated_copy_is_zero_and_reflection_is_not():
    x = _chain(25, seed=1)
    moved = x @ _rotation(2).T + np.array([10.0, 0, -4])
    assert rmsd_ca(moved, x) == pytest.approx(0.0, abs=1e-6)
    assert rmsd_ca(torch.tensor(moved), torch.tensor(x)) == pytest.approx(0.0, abs=1e-6)
    mirrored = x * np.array([1, 1, -1])
    assert rmsd_ca(mirrored, x) > 1.0                        # no improper rotations
    rot, t = kabsch(moved, x)
    assert np.linalg.det(rot) == pytest.approx(1.0)
    np.testing.assert_allclose(superpose(moved, x), x, atol=1e-6)


def test_rmsd_known_value_and_mask():
    x = _chain(10, seed=3)
    noisy = x.copy()
    noisy[:, 0] += np.where(np.arange(10) % 2 == 0, 1.0, -1.0)   # zero-mean ±1 Å along x
    # the optimal superposition cannot do better than ~1 Å; it also cannot be worse
    assert 0.5 < rmsd_ca(noisy, x) <= 1.0 + 1e-9
    far = x.copy()
    far[0] += 50.0
    mask = np.ones(10)
    mask[0] = 0
    assert rmsd_ca(far, x, mask) == pytest.approx(0.0, abs=1e-6)


def test_gdt_ts():
    x = _chain(40, seed=4)
    assert gdt_ts(x @ _rotation(5).T + 3.0, x) == pytest.approx(1.0)
    # 10 of 40 residues displaced by 5 Å: at 1 and 2 Å at most the 30 others fit (no shift puts
    # both groups under 2 Å); at 4 and 8 Å a half shift fits all 40.
    moved = x.copy()
    moved[-10:] += np.array([0.0, 0.0, 5.0])
    score = gdt_ts(moved, x)
    assert score == pytest.approx((30 / 40 + 30 / 40 + 1 + 1) / 4, abs=0.02)
    with pytest.raises(ValueError):
        lddt_ca(np.zeros((3, 3)), np.zeros((4, 3)))
    assert math.isfinite(gdt_ts(x[:2], x[:2]))


def test_rmsd_matches_scipy_reference():
    from scipy.spatial.transform import Rotation
    rng = np.random.default_rng(9)
    x = _chain(20, seed=9)
    y = x @ _rotation(10).T + rng.normal(scale=1.5, size=x.shape)
    xc, yc = x - x.mean(0), y - y.mean(0)
    _, rssd = Rotation.align_vectors(yc, xc)          # rotates xc onto yc, root of summed squares
    assert rmsd_ca(x, y) == pytest.approx(rssd / np.sqrt(len(x)), rel=1e-6)
