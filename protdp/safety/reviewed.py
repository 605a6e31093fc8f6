"""Reviewer decisions as a table, shared by the gate's reviewed calibrations (the pLDDT part,
`protdp.safety.review_calibration`, and the complex part, `protdp.safety.interface_calibration`):
the decided items' inputs and verdicts, their counts, the "too few reviews" rule and the
cross-validated reliability of a fitted P(approve).
"""

from __future__ import annotations

import math

import numpy as np

MIN_REVIEWS = 30
MIN_PER_CLASS = 5
RELIABILITY_BINS = 10


def decided_table(records: list[dict], values_of, n_inputs: int) -> dict:
    """X [N, n_inputs] from `values_of(record)`, approved y [N], and what was left out:
    escalations, and records with a missing or non-finite value. Records for which
    `values_of` returns None are not this table's (not counted)."""
    rows, y, skipped = [], [], {"escalated": 0, "incomplete": 0}
    for rec in records:
        values = values_of(rec)
        if values is None:
            continue
        if rec["decision"] not in ("approved", "rejected"):
            skipped["escalated"] += 1
            continue
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
               for v in values):
            skipped["incomplete"] += 1
            continue
        rows.append([float(v) for v in values])
        y.append(rec["decision"] == "approved")
    return {"X": np.array(rows, float).reshape(-1, n_inputs), "y": np.array(y, bool),
            "skipped": skipped}


def decision_counts(table: dict) -> dict:
    """Decisions, approved, rejected and what was left out, of a `decided_table`."""
    y = table["y"]
    return {"decisions": int(len(y)), "approved": int(y.sum()), "rejected": int((~y).sum()),
            "skipped": table["skipped"]}


def too_few_reviews(counts: dict, noun: str, left_alone: str) -> str | None:
    """The report's message when `counts` (`decision_counts`) are too few to fit a model:
    fewer than MIN_REVIEWS decisions or fewer than MIN_PER_CLASS of either verdict; None when
    there are enough. `noun` names what was reviewed, `left_alone` what stays as configured."""
    if counts["decisions"] >= MIN_REVIEWS and min(counts["approved"],
                                                   counts["rejected"]) >= MIN_PER_CLASS:
        return None
    return (f"{counts['decisions']} reviewed {noun} ({counts['approved']} approved, "
            f"{counts['rejected']} rejected): need >= {MIN_REVIEWS} with >= {MIN_PER_CLASS} of "
            f"each; {left_alone} left as configured")


def reliability(y: np.ndarray, p_cv: np.ndarray) -> dict:
    """Cross-validated reliability: observed approval rate per bin of predicted probability."""
    from sklearn.calibration import calibration_curve
    from sklearn.metrics import brier_score_loss, roc_auc_score

    bins = min(RELIABILITY_BINS, max(2, len(y) // 10))
    observed, predicted = calibration_curve(y, p_cv, n_bins=bins, strategy="quantile")
    return {"bins": [{"predicted": float(p), "observed": float(o)}
                     for p, o in zip(predicted, observed)],
            "brier": float(brier_score_loss(y, p_cv)), "auc": float(roc_auc_score(y, p_cv)),
            "base_rate": float(y.mean())}
