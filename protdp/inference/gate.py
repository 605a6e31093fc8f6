"""Confidence gate: route every prediction to exactly one of accepted / needs_review / rejected.

pLDDT is AF2's per-residue confidence head (AF2 supplement §1.9.6, Algorithm 29): a predicted
lDDT-Cα on a 0–100 scale. AlphaFold DB colours it in four bands, reported here per target:
very high (> 90), confident (70–90), low (50–70) and very low (< 50). Residues below 50 are
often disordered or wrong; AF2's accuracy also falls for shallow MSAs (AF2 paper, Fig. 5a: a
sharp drop below ~30 effective sequences) and for inputs longer than anything seen in training.

The rule is conservative: a prediction is `accepted` only when *every* check passes; any flag
sends it to `needs_review` with machine-readable reason codes; invalid input is `rejected`.
Nothing low-confidence, non-finite or out of the training distribution can be accepted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from protdp.errors import InputError

ROUTES = ("accepted", "needs_review", "rejected")

# AFDB bands, highest first (AFDB: >90, 70–90, 50–70, <50). Boundaries: exactly 90 and exactly
# 70 are "confident", exactly 50 is "low" -- consistent with the gate's "mean >= 70" and "< 50".
AFDB_BANDS = ("very_high", "confident", "low", "very_low")
AFDB_BAND_LABELS = {
    "very_high": "Very high (pLDDT > 90)",
    "confident": "Confident (70 ≤ pLDDT ≤ 90)",
    "low": "Low (50 ≤ pLDDT < 70)",
    "very_low": "Very low (pLDDT < 50)",
}

# Reason codes -> one line for people (the web UI and CLI show these next to the code).
REASON_TEXT = {
    "invalid_input": "input was invalid; no usable prediction",
    "invalid_plddt": "pLDDT vector is non-finite, outside 0–100, or empty",
    "low_mean_plddt": "mean pLDDT below the acceptance threshold",
    "low_plddt_fraction": "too many residues with very low pLDDT",
    "length_beyond_training_crop": "sequence longer than the training crop",
    "shallow_msa": "MSA shallower than the configured minimum",
    "screening": "sequence matched the safety screening list",
    "low_complexity": "low-complexity sequence (homopolymer or short repeat): confident-looking "
                      "but rarely meaningful",
}


@dataclass
class GatePolicy:
    """Thresholds of the confidence gate (configs/gating.yaml maps 1:1 onto these fields)."""

    accept_mean_plddt: float = 70.0
    """Mean pLDDT at or above which a prediction may be accepted (below: needs_review)."""
    very_low_plddt: float = 50.0
    """Residues with pLDDT strictly below this count as very low confidence."""
    max_very_low_fraction: float = 0.25
    """Largest tolerated fraction of very-low residues; above it: needs_review."""
    min_msa_depth: int = 30
    """MSA rows (query included) below which the input is out of distribution: needs_review."""
    review_beyond_training_crop: bool = True
    """Send targets longer than the checkpoint's training crop to review."""
    max_single_residue_fraction: float = 0.5
    """Largest tolerated fraction of one residue type; above it: low_complexity (review)."""
    min_sequence_entropy_bits: float = 2.0
    """Shannon entropy of the residue composition (bits) below which a sequence of at least
    20 residues is low-complexity (natural proteins: ~4.2 bits; a dipeptide repeat: 1 bit)."""

    def __post_init__(self):
        for name in ("accept_mean_plddt", "very_low_plddt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
                raise ValueError(f"{name} must be a number in [0, 100], got {value!r}")
        frac = self.max_very_low_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
            raise ValueError(f"max_very_low_fraction must be a number in [0, 1], got {frac!r}")
        if isinstance(self.min_msa_depth, bool) or not isinstance(self.min_msa_depth, int) \
                or self.min_msa_depth < 0:
            raise ValueError(f"min_msa_depth must be a non-negative integer, got {self.min_msa_depth!r}")
        frac = self.max_single_residue_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
            raise ValueError(f"max_single_residue_fraction must be a number in (0, 1], got {frac!r}")
        bits = self.min_sequence_entropy_bits
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 0 <= bits <= 4.33:
            raise ValueError(f"min_sequence_entropy_bits must be a number in [0, 4.32], got {bits!r}")
        if not isinstance(self.review_beyond_training_crop, bool):
            raise ValueError("review_beyond_training_crop must be true or false, "
                             f"got {self.review_beyond_training_crop!r}")


@dataclass
class GateDecision:
    """Where one prediction goes and why; `to_dict()` is what summary/provenance record."""

    route: str
    reasons: list[str]
    mean_plddt: float | None
    afdb_bands: dict[str, float]
    very_low_fraction: float | None
    details: dict[str, str] = field(default_factory=dict)
    policy: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def afdb_bands(plddt: np.ndarray) -> dict[str, float]:
    """Fraction of residues in each AFDB band (sums to 1 for a non-empty vector)."""
    p = np.asarray(plddt, dtype=np.float64)  # [L]
    if p.size == 0:
        return {name: 0.0 for name in AFDB_BANDS}
    counts = {
        "very_high": int(np.sum(p > 90)),
        "confident": int(np.sum((p >= 70) & (p <= 90))),
        "low": int(np.sum((p >= 50) & (p < 70))),
        "very_low": int(np.sum(p < 50)),
    }
    return {name: counts[name] / p.size for name in AFDB_BANDS}


def band_of(value: float) -> str:
    """AFDB band name of one pLDDT value (e.g. the mean)."""
    if value > 90:
        return "very_high"
    if value >= 70:
        return "confident"
    if value >= 50:
        return "low"
    return "very_low"


def sequence_complexity(sequence: str) -> tuple[float, float]:
    """(largest single-residue fraction, Shannon entropy in bits) of a one-letter sequence."""
    if not sequence:
        return 0.0, 0.0
    _, counts = np.unique(np.frombuffer(sequence.upper().encode("ascii", "replace"), np.uint8),
                          return_counts=True)
    p = counts / counts.sum()
    return float(p.max()), float(-(p * np.log2(p)).sum())


def route(plddt: np.ndarray, *, length: int, msa_depth: int, training_crop: int | None,
          screening_hits: Sequence = (), invalid_reason: str | None = None,
          policy: GatePolicy, sequence: str | None = None) -> GateDecision:
    """Route one prediction. `plddt` is [L] on the 0–100 scale; `length` must equal L.

    `invalid_reason` (set by the predictor for a bad target) -> rejected. Otherwise every failed
    check adds a reason code and the prediction needs review; only a clean pass is accepted.
    """
    policy_dict = dataclasses.asdict(policy)
    if invalid_reason is not None:
        return GateDecision("rejected", ["invalid_input"], None, afdb_bands(np.zeros(0)), None,
                            {"invalid_input": str(invalid_reason)}, policy_dict)

    p = np.asarray(plddt, dtype=np.float64)  # [L]
    if p.ndim != 1:
        raise InputError(f"expected a 1-D per-residue vector, got shape {p.shape}", field="plddt")
    if p.shape[0] != length:
        raise InputError(f"{p.shape[0]} values for a sequence of length {length}", field="plddt")

    reasons: list[str] = []
    details: dict[str, str] = {}
    if p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0) or np.any(p > 100):
        # A broken confidence head must never look confident: review, with no summary numbers.
        bad = int(np.sum(~np.isfinite(p) | (p < 0) | (p > 100))) if p.size else 0
        reasons.append("invalid_plddt")
        details["invalid_plddt"] = (f"{bad} of {p.size} values non-finite or outside 0–100"
                                    if p.size else "empty pLDDT vector")
        mean, very_low, bands = None, None, afdb_bands(np.zeros(0))
    else:
        mean = float(p.mean())
        very_low = float(np.mean(p < policy.very_low_plddt))
        bands = afdb_bands(p)
        if not mean >= policy.accept_mean_plddt:
            reasons.append("low_mean_plddt")
            details["low_mean_plddt"] = f"mean pLDDT {mean:.1f} < {policy.accept_mean_plddt:g}"
        if very_low > policy.max_very_low_fraction:
            reasons.append("low_plddt_fraction")
            details["low_plddt_fraction"] = (
                f"{very_low:.1%} of residues below pLDDT {policy.very_low_plddt:g} "
                f"(max {policy.max_very_low_fraction:.0%})")

    if policy.review_beyond_training_crop and training_crop is not None and length > training_crop:
        reasons.append("length_beyond_training_crop")
        details["length_beyond_training_crop"] = f"length {length} > training crop {training_crop}"
    if msa_depth < policy.min_msa_depth:
        reasons.append("shallow_msa")
        details["shallow_msa"] = f"MSA depth {msa_depth} < minimum {policy.min_msa_depth}"
    if sequence:
        top, bits = sequence_complexity(sequence)
        if top > policy.max_single_residue_fraction or (
                len(sequence) >= 20 and bits < policy.min_sequence_entropy_bits):
            reasons.append("low_complexity")
            details["low_complexity"] = (f"one residue type is {top:.0%} of the sequence, "
                                         f"composition entropy {bits:.2f} bits")
    hits = list(screening_hits or ())
    if hits:
        reasons.append("screening")
        details["screening"] = "; ".join(str(h) for h in hits)

    decision_route = "needs_review" if reasons else "accepted"
    return GateDecision(decision_route, reasons, mean, bands, very_low, details, policy_dict)
