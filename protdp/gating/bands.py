"""AlphaFold DB confidence bands of pLDDT (AF2 supplement §1.9.6, Algorithm 29: a predicted
lDDT-Cα on a 0–100 scale), defined once: very high (> 90), confident (70–90), low (50–70),
very low (< 50). Boundaries: exactly 90 and exactly 70 are "confident", exactly 50 is "low",
consistent with the gate's "mean >= 70" and "< 50".
"""

from __future__ import annotations

import numpy as np

AFDB_BANDS = ("very_high", "confident", "low", "very_low")        # highest first
# lowest pLDDT of each band and whether that edge itself belongs to it
AFDB_BAND_FLOORS = {"very_high": (90.0, False), "confident": (70.0, True), "low": (50.0, True),
                    "very_low": (0.0, True)}
AFDB_BAND_LABELS = {
    "very_high": "Very high (pLDDT > 90)",
    "confident": "Confident (70 ≤ pLDDT ≤ 90)",
    "low": "Low (50 ≤ pLDDT < 70)",
    "very_low": "Very low (pLDDT < 50)",
}
AFDB_BAND_COLORS = {"very_high": "#0053d6", "confident": "#65cbf3", "low": "#ffdb13",
                    "very_low": "#ff7d45"}                       # AlphaFold DB's palette


def band_ranges() -> dict[str, tuple[float, float]]:
    """(low, high) pLDDT range of every band on the 0–100 axis (for plots)."""
    floors = [AFDB_BAND_FLOORS[b][0] for b in AFDB_BANDS]
    return {b: (lo, hi) for b, lo, hi in zip(AFDB_BANDS, floors, [100.0] + floors[:-1])}


def _in_band(p: np.ndarray, band: str) -> np.ndarray:
    floor, inclusive = AFDB_BAND_FLOORS[band]
    return p >= floor if inclusive else p > floor


def band_index(p: np.ndarray) -> np.ndarray:
    """Index into AFDB_BANDS of each pLDDT value [*] (the highest band it qualifies for)."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, len(AFDB_BANDS) - 1, dtype=np.int64)
    for i in reversed(range(len(AFDB_BANDS) - 1)):
        out[_in_band(p, AFDB_BANDS[i])] = i
    return out


def band_of(value: float) -> str:
    """AFDB band name of one pLDDT value (e.g. the mean)."""
    return AFDB_BANDS[int(band_index(np.asarray(value)))]


def afdb_bands(plddt: np.ndarray) -> dict[str, float]:
    """Fraction of residues in each AFDB band (sums to 1 for a non-empty vector)."""
    p = np.asarray(plddt, dtype=np.float64)  # [L]
    if p.size == 0:
        return {name: 0.0 for name in AFDB_BANDS}
    counts = np.bincount(band_index(p), minlength=len(AFDB_BANDS))
    return {name: int(counts[i]) / p.size for i, name in enumerate(AFDB_BANDS)}
