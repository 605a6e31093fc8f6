"""Cropping a complex across its chains for training (AlphaFold-Multimer, Evans et al. 2021,
§7.2.1: Algorithm 1 "contiguous cropping" and Algorithm 2 "spatial cropping"; AlphaFold 3
reuses both).

Contiguous (`contiguous_crop`):

Chains are visited in random order; each keeps one contiguous window whose length is drawn
uniformly between the least that still lets the chains not yet visited fill the crop and the
most the crop has room for, at a uniformly drawn start. The windows together hold exactly
min(crop_size, total length) residues, and every chain's window is contiguous (possibly
empty).

Spatial (`spatial_crop`): an interface residue (resolved Cα within `INTERFACE_CA_DISTANCE` of a
resolved Cα of another chain) is drawn uniformly; the crop is the `crop_size` residues whose Cα
is nearest to it (unresolved residues last, ties broken towards the lower index). A complex
without an interface falls back to the contiguous crop. (OpenFold's port, the only published
training code, takes the least distance between same-named atoms with a 10 Å threshold,
`interface_threshold`; protdp measures Cα only, and `threshold` is a parameter.)

`choose_crop` draws the mode as AlphaFold-Multimer trains: spatial with probability
`SPATIAL_CROP_PROB`, else contiguous, complexes no longer than the crop kept whole; every
draw comes from the one generator, so a seed fixes the crop.
"""

from __future__ import annotations

import numpy as np

SPATIAL_CROP_PROB = 0.5        # AF-Multimer §7.2.1 (OpenFold multimer config spatial_crop_prob)
INTERFACE_CA_DISTANCE = 6.0    # Å: Cα-Cα to another chain that makes a residue an interface one
TIE_BREAK = 1e-3               # Å per residue index added to distances (stable, lower index first)


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


def chain_lengths(asym_id: np.ndarray) -> list[int]:
    """Lengths of the runs of equal asym ids [L] (chains are contiguous blocks)."""
    asym_id = np.asarray(asym_id)
    starts = np.r_[0, np.nonzero(np.diff(asym_id))[0] + 1, len(asym_id)]
    return np.diff(starts).astype(int).tolist()


def interface_residues(ca: np.ndarray, ca_mask: np.ndarray, asym_id: np.ndarray,
                       threshold: float = INTERFACE_CA_DISTANCE) -> np.ndarray:
    """ca [L, 3], ca_mask [L], asym_id [L] -> indices of resolved residues with a resolved Cα
    of another chain closer than `threshold` Å."""
    ca = np.asarray(ca, np.float64)
    ok = np.asarray(ca_mask) > 0
    d = np.sqrt(((ca[:, None] - ca[None]) ** 2).sum(-1))                     # [L, L]
    other = np.asarray(asym_id)[:, None] != np.asarray(asym_id)[None, :]
    near = (d < threshold) & other & ok[:, None] & ok[None, :]
    return np.nonzero(near.any(1))[0]


def spatial_crop(ca: np.ndarray, ca_mask: np.ndarray, asym_id: np.ndarray, crop_size: int,
                 rng: np.random.Generator,
                 threshold: float = INTERFACE_CA_DISTANCE) -> np.ndarray:
    """-> bool mask [L]: the crop_size residues nearest (Cα) to a random interface residue."""
    asym_id = np.asarray(asym_id)
    L = len(asym_id)
    if crop_size >= L:
        return np.ones(L, bool)
    interface = interface_residues(ca, ca_mask, asym_id, threshold)
    if len(interface) == 0:
        return contiguous_crop(chain_lengths(asym_id), crop_size, rng)
    centre = int(interface[rng.integers(0, len(interface))])
    ca = np.asarray(ca, np.float64)
    d = np.sqrt(((ca - ca[centre]) ** 2).sum(-1))
    d = np.where(np.asarray(ca_mask) > 0, d, np.inf) + TIE_BREAK * np.arange(L)
    mask = np.zeros(L, bool)
    mask[np.argsort(d, kind="stable")[:crop_size]] = True
    return mask


def choose_crop(ca: np.ndarray, ca_mask: np.ndarray, asym_id: np.ndarray, crop_size: int,
                rng: np.random.Generator, spatial_prob: float = SPATIAL_CROP_PROB
                ) -> tuple[np.ndarray, str]:
    """(bool mask [L], "whole" | "spatial" | "contiguous"): AlphaFold-Multimer's choice.
    Chains must be contiguous blocks of `asym_id` (the features' layout)."""
    asym_id = np.asarray(asym_id)
    use_spatial = rng.random() < spatial_prob          # drawn always: one stream per seed
    if crop_size >= len(asym_id):
        return np.ones(len(asym_id), bool), "whole"
    if use_spatial:
        return spatial_crop(ca, ca_mask, asym_id, crop_size, rng), "spatial"
    return contiguous_crop(chain_lengths(asym_id), crop_size, rng), "contiguous"
