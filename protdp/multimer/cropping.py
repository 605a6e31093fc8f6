"""Cropping a complex across its chains for training (AlphaFold-Multimer, Evans et al. 2021,
Algorithm 1 "contiguous cropping"; AlphaFold 3 reuses it as "ContiguousCropping").

Chains are visited in random order; each keeps one contiguous window whose length is drawn
uniformly between the least that still lets the chains not yet visited fill the crop and the
most the crop has room for, at a uniformly drawn start. The windows together hold exactly
min(crop_size, total length) residues, and every chain's window is contiguous (possibly
empty). Not here yet: the spatial (interface-centred) crop of the same paper.
"""

from __future__ import annotations

import numpy as np


def contiguous_crop(chain_lengths: list[int], crop_size: int,
                    rng: np.random.Generator) -> np.ndarray:
    """-> bool mask [sum(chain_lengths)] in the chains' input order."""
    if crop_size < 0 or any(n < 0 for n in chain_lengths):
        raise ValueError("crop size and chain lengths must be >= 0")
    starts = np.concatenate([[0], np.cumsum(chain_lengths)[:-1]]).astype(int)
    mask = np.zeros(int(sum(chain_lengths)), bool)
    added, remaining = 0, int(sum(chain_lengths))
    for k in rng.permutation(len(chain_lengths)):
        n = int(chain_lengths[k])
        remaining -= n
        most = min(crop_size - added, n)
        least = min(n, max(0, crop_size - (added + remaining)))
        size = int(rng.integers(least, most + 1))
        added += size
        start = int(rng.integers(0, n - size + 1))
        mask[starts[k] + start: starts[k] + start + size] = True
    return mask
