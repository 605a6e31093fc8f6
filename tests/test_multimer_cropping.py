"""Contiguous cropping across chains (protdp.multimer.cropping, AlphaFold-Multimer Algorithm 1):
the crop holds exactly min(crop size, total) residues, one contiguous window per chain, every
window size occurs, and chain order does not bias which chain gets the room."""

from __future__ import annotations

import numpy as np
import pytest

from protdp.multimer.cropping import contiguous_crop


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
