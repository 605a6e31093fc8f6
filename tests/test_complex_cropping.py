"""Contiguous cropping across chains (protdp.complex.cropping, AlphaFold-Multimer Algorithm 1):
the crop holds exactly min(crop size, total) residues, one contiguous window per chain, every
window size occurs, and chain order does not bias which chain gets the room."""

from __future__ import annotations

import numpy as np
import pytest

from protdp.complex.cropping import contiguous_crop


def _windows(mask, lengths):
    out, start = [], 0
    for n in lengths:
        m = mask[start:start + n]
        idx = np.nonzero(m)[0]
        if len(idx):
            assert idx[-1] - idx[0] + 1 == len(idx), "window is not contiguous"
        out.append(len(idx))
        start += n
    return out


@pytest.mark.parametrize("lengths,crop", [([50, 30, 80], 64), ([10, 10], 64), ([5, 300], 40),
                                          ([0, 20, 7], 10), ([12], 12)])
def test_crop_size_and_contiguity(lengths, crop):
    rng = np.random.default_rng(0)
    for _ in range(200):
        mask = contiguous_crop(lengths, crop, rng)
        assert mask.sum() == min(crop, sum(lengths))
        sizes = _windows(mask, lengths)
        assert all(0 <= s <= n for s, n in zip(sizes, lengths))


def test_window_sizes_cover_the_range_for_both_chains():
    rng = np.random.default_rng(1)
    seen = [set(), set()]
    for _ in range(2000):
        for k, s in enumerate(_windows(contiguous_crop([20, 20], 20, rng), [20, 20])):
            seen[k].add(s)
    assert seen[0] == seen[1] == set(range(21))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        contiguous_crop([10, -1], 5, np.random.default_rng(0))


# ------------------------------------------------------------ spatial crop (Algorithm 2)

from protdp.complex.cropping import (INTERFACE_CA_DISTANCE, SPATIAL_CROP_PROB,  # noqa: E402
                                      choose_crop, interface_residues, spatial_crop)


def _two_chains(rng, gap):
    """Two 30-residue Cα walks; chain B starts `gap` Å past chain A's last residue."""
    steps = rng.normal(size=(60, 3))
    steps *= 3.8 / np.linalg.norm(steps, axis=1, keepdims=True)
    a = np.cumsum(steps[:30], 0)
    b = a[-1] + np.array([gap, 0, 0]) + np.cumsum(steps[30:], 0)
    return np.concatenate([a, b]), np.r_[np.ones(30), 2 * np.ones(30)]


def test_interface_residues_match_brute_force():
    rng = np.random.default_rng(3)
    ca, asym = _two_chains(rng, 4.0)
    mask = (rng.random(60) > 0.1).astype(float)
    want = [i for i in range(60) if mask[i] and any(
        mask[j] and asym[j] != asym[i] and np.linalg.norm(ca[i] - ca[j]) < INTERFACE_CA_DISTANCE
        for j in range(60))]
    assert interface_residues(ca, mask, asym).tolist() == want and want


def test_spatial_crop_is_the_nearest_residues_around_an_interface_residue():
    rng = np.random.default_rng(4)
    ca, asym = _two_chains(rng, 4.0)
    mask = np.ones(60)
    interface = set(interface_residues(ca, mask, asym).tolist())
    for seed in range(20):
        keep = spatial_crop(ca, mask, asym, 24, np.random.default_rng(seed))
        assert keep.sum() == 24
        assert interface & set(np.nonzero(keep)[0].tolist()), "no interface residue kept"
        # some kept residue is the centre: every kept residue is nearer to it than every dropped
        ok = False
        for c in set(np.nonzero(keep)[0].tolist()) & interface:
            d = np.linalg.norm(ca - ca[c], axis=1)
            ok |= d[keep].max() <= d[~keep].min() + 1e-9
        assert ok
        again = spatial_crop(ca, mask, asym, 24, np.random.default_rng(seed))
        assert np.array_equal(keep, again)                       # deterministic for a seed


def test_spatial_crop_without_interface_falls_back_to_contiguous():
    rng = np.random.default_rng(5)
    ca, asym = _two_chains(rng, 200.0)
    assert len(interface_residues(ca, np.ones(60), asym)) == 0
    keep = spatial_crop(ca, np.ones(60), asym, 20, np.random.default_rng(0))
    assert keep.sum() == 20 and all(s <= n for s, n in zip(_windows(keep, [30, 30]), [30, 30]))


def test_choose_crop_mixes_modes_with_alphafold_probability_and_is_deterministic():
    rng = np.random.default_rng(6)
    ca, asym = _two_chains(rng, 4.0)
    modes = [choose_crop(ca, np.ones(60), asym, 24, np.random.default_rng(s))[1]
             for s in range(400)]
    frac = modes.count("spatial") / len(modes)
    assert abs(frac - SPATIAL_CROP_PROB) < 0.08 and set(modes) == {"spatial", "contiguous"}
    for s in range(10):
        a = choose_crop(ca, np.ones(60), asym, 24, np.random.default_rng(s))
        b = choose_crop(ca, np.ones(60), asym, 24, np.random.default_rng(s))
        assert a[1] == b[1] and np.array_equal(a[0], b[0]) and a[0].sum() == 24
    whole, mode = choose_crop(ca, np.ones(60), asym, 60, np.random.default_rng(0))
    assert mode == "whole" and whole.all()
