"""Reviewed calibration: reviewers' decisions fed back into the gate
(`protdp calibrate --from-reviews QUEUE_URL`).

From every approved or rejected item of a review queue (escalations carry no verdict) this
fits the probability that a reviewer approves a prediction from its mean pLDDT, very-low
fraction (pLDDT < 50, AFDB band; AF2 supplement §1.9.6, Algorithm 29), MSA depth and length:
logistic regression on standardised features (log MSA depth, log length), or isotonic
regression on mean pLDDT alone (scikit-learn). Its reliability is measured on cross-validated
predictions (a reliability plot and the Brier score).

Proposed gate: thresholds (mean pLDDT, very-low fraction, MSA depth) such that *every*
prediction the gate would accept has a predicted rejection probability at most `target`
(default 2 %), so the rate of auto-accepted predictions reviewers would have rejected stays
under the target whatever the mix of accepted predictions. Because the fitted model is
monotone in each feature, the worst prediction inside the acceptance box sits at one of its
corners (observed range for length and depth). The configured policy is the floor: thresholds
only tighten. Among the safe candidates the one accepting the most reviewed items wins (then
the lowest mean-pLDDT threshold). With fewer than MIN_REVIEWS decisions, or fewer than
MIN_PER_CLASS of either verdict, the report says so and proposes nothing, so the gate stays as
configured. Held-out complexes (reviewed complex items) calibrate the complex checks, ipTM and
interface PAE, the same way (`interface_calibration`; the report's "complexes" section).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np

from protdp.errors import InputError
from protdp.fileio import atomic_write_json
from protdp.gating import GatePolicy
from protdp.gating.policy import REVIEWED_CALIBRATION_FORMAT
from protdp.safety.reviewed import (MIN_PER_CLASS, MIN_REVIEWS, decided_table,  # noqa: F401
                                    decision_counts, reliability, too_few_reviews)

FEATURES = ("mean_plddt", "very_low_fraction", "msa_depth", "length")
METHODS = ("logistic", "isotonic")
DEFAULT_TARGET = 0.02
MEAN_STEP = 0.5                                    # mean-pLDDT threshold grid (pLDDT units)
VLF_GRID = (0.25, 0.2, 0.15, 0.1, 0.05, 0.0)       # candidate very-low fractions (tighten only)


# ------------------------------------------------------------------------------ data

def review_table(records: list[dict]) -> dict:
    """Features X [N, 4] (FEATURES order), approved y [N] and what was left out, from the
    queue's decided items (`ReviewStore.export_records`)."""
    return decided_table(records, lambda rec: [rec.get(f) for f in FEATURES], len(FEATURES))


def design(X: np.ndarray) -> np.ndarray:
    """Model inputs: mean pLDDT, very-low fraction, log(1 + depth), log(1 + length). [N, 4]"""
    return np.column_stack([X[:, 0], X[:, 1], np.log1p(X[:, 2]), np.log1p(X[:, 3])])


# ------------------------------------------------------------------------------ model

def make_model(method: str):
    """An unfitted scikit-learn estimator of P(approve | features)."""
    if method == "logistic":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import FunctionTransformer, StandardScaler
        return make_pipeline(FunctionTransformer(design), StandardScaler(),
                             LogisticRegression(C=1.0, max_iter=1000))
    if method == "isotonic":
        from sklearn.isotonic import IsotonicRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import FunctionTransformer
        return make_pipeline(FunctionTransformer(lambda X: X[:, 0]),
                             IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True,
                                                out_of_bounds="clip"))
    raise InputError(f"method must be one of {METHODS}, got {method!r}", field="--method")


def approve_probability(model, X: np.ndarray) -> np.ndarray:
    """P(approve) [N] from a fitted model."""
    est = model[-1]
    if hasattr(est, "predict_proba"):
        return model.predict_proba(X)[:, 1]
    return np.clip(model.predict(X), 0.0, 1.0)


def cross_validated(method: str, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    folds = StratifiedKFold(n_splits=min(5, int(y.sum()), int((~y).sum())), shuffle=True,
                            random_state=0)
    method_name = "predict_proba" if method == "logistic" else "predict"
    out = cross_val_predict(make_model(method), X, y, cv=folds, method=method_name)
    return np.clip(out[:, 1] if out.ndim == 2 else out, 0.0, 1.0)


# ------------------------------------------------------------------------------ thresholds

def worst_corner(X: np.ndarray, thresholds: tuple[float, float, float]) -> np.ndarray:
    """The acceptance box's corners (mean in [t_mean, 100], very-low fraction in [0, t_vlf],
    depth in [t_depth, max seen], length in [min, max seen]) as rows [16, 4]; the model is
    monotone in each feature, so the worst prediction the gate would accept is one of them."""
    t_mean, t_vlf, t_depth = thresholds
    ranges = [(t_mean, 100.0), (0.0, t_vlf), (t_depth, max(t_depth, X[:, 2].max())),
              (X[:, 3].min(), X[:, 3].max())]
    return np.array(np.meshgrid(*ranges, indexing="ij")).reshape(len(FEATURES), -1).T  # [16, 4]


def propose_thresholds(model, X: np.ndarray, floor: GatePolicy, target: float) -> dict:
    """The tightest-necessary gate keeping every accepted prediction's predicted rejection
    probability <= target; the configured `floor` is never loosened."""
    means = np.arange(floor.accept_mean_plddt, 100.0 + 1e-9, MEAN_STEP)
    vlfs = sorted({floor.max_very_low_fraction, *(v for v in VLF_GRID
                                                   if v < floor.max_very_low_fraction)},
                  reverse=True)
    seen = X[:, 2][X[:, 2] > floor.min_msa_depth]
    depths = sorted({floor.min_msa_depth,
                     *(int(math.ceil(np.quantile(seen, q))) for q in (0.25, 0.5, 0.75)
                       if len(seen))})
    best = None
    for t_vlf in vlfs:
        for t_depth in depths:
            for t_mean in means:
                corners = worst_corner(X, (t_mean, t_vlf, t_depth))
                worst = float(1.0 - approve_probability(model, corners).min())
                if worst <= target:
                    inside = (X[:, 0] >= t_mean) & (X[:, 1] <= t_vlf) & (X[:, 2] >= t_depth)
                    key = (int(inside.sum()), -t_mean, t_vlf, -t_depth)
                    if best is None or key > best[0]:
                        best = (key, t_mean, t_vlf, t_depth, worst, inside)
                    break                   # higher mean thresholds only accept fewer
    if best is None:
        return {"achievable": False, "accept_mean_plddt": 100.0,
                "max_very_low_fraction": floor.max_very_low_fraction,
                "min_msa_depth": floor.min_msa_depth, "worst_reject_probability": None,
                "reviewed_in_region": 0}
    _, t_mean, t_vlf, t_depth, worst, inside = best
    return {"achievable": True, "accept_mean_plddt": float(t_mean),
            "max_very_low_fraction": float(t_vlf), "min_msa_depth": int(t_depth),
            "worst_reject_probability": worst, "reviewed_in_region": int(inside.sum()),
            "inside_mask": inside}


# ------------------------------------------------------------------------------ report

def fit_report(records: list[dict], floor: GatePolicy, *, target: float = DEFAULT_TARGET,
               method: str = "logistic") -> dict:
    """The whole reviewed calibration as a JSON-able dict (status "ok" or
    "insufficient_reviews")."""
    if not 0.0 < target < 1.0:
        raise InputError(f"must be in (0, 1), got {target}", field="--target-reject-rate")
    from protdp.safety.interface_calibration import fit_complex_report

    complexes = fit_complex_report(records, floor, target=target)   # ipTM / interface PAE
    table = review_table(records)
    X, y = table["X"], table["y"]
    counts = decision_counts(table)
    doc = {"format": REVIEWED_CALIBRATION_FORMAT, "method": method, "target_reject_rate": target,
           "features": list(FEATURES), "counts": counts,
           "floor": {k: getattr(floor, k) for k in ("accept_mean_plddt", "max_very_low_fraction",
                                                     "min_msa_depth")},
           "complexes": complexes}
    shortfall = too_few_reviews(counts, "decisions", "the gate is")
    if shortfall:
        doc.update(status="insufficient_reviews", message=shortfall)
        return doc
    model = make_model(method).fit(X, y)
    proposal = propose_thresholds(model, X, floor, target)
    inside = proposal.pop("inside_mask", np.zeros(len(y), bool))
    p = approve_probability(model, X)
    proposal["expected_reject_rate_in_region"] = (
        float(1.0 - p[inside].mean()) if inside.any() else None)
    proposal["observed_reject_rate_in_region"] = (
        float((~y[inside]).mean()) if inside.any() else None)
    doc.update(status="ok", policy=proposal, reliability=reliability(y, cross_validated(
        method, X, y)), model=_describe(model, method))
    return doc


def _describe(model, method: str) -> dict:
    if method == "logistic":
        scaler, lr = model[1], model[2]
        return {"inputs": ["mean_plddt", "very_low_fraction", "log1p(msa_depth)",
                           "log1p(length)"],
                "coef_standardised": lr.coef_[0].tolist(),
                "intercept": float(lr.intercept_[0]), "mean": scaler.mean_.tolist(),
                "scale": scaler.scale_.tolist()}
    iso = model[-1]
    return {"inputs": ["mean_plddt"], "x": iso.X_thresholds_.round(3).tolist(),
            "p_approve": iso.y_thresholds_.round(4).tolist()}


def plot_reliability(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
    rel = doc["reliability"]
    ax.plot([b["predicted"] for b in rel["bins"]], [b["observed"] for b in rel["bins"]], "o-",
            label=f"cross-validated (Brier {rel['brier']:.3f}, AUC {rel['auc']:.2f})")
    ax.axhline(1 - doc["target_reject_rate"], color="red", lw=0.8, ls=":",
               label=f"approval needed to auto-accept ({1 - doc['target_reject_rate']:.0%})")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="predicted P(reviewer approves)",
           ylabel="observed approval rate",
           title=f"Reviewed calibration ({doc['counts']['decisions']} decisions, {doc['method']})")
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def calibrate_from_reviews(queue_url: str, out_dir: str | Path, *, floor: GatePolicy,
                           admin_token: str | None, target: float = DEFAULT_TARGET,
                           method: str = "logistic") -> Path:
    """Read the queue (an admin's: `verify` first, refused items named in the report), fit,
    write review_calibration.json (+ .png when fitted); returns it."""
    from protdp.review.store import ReviewStore
    from protdp.review.trusted import trusted_records

    store = ReviewStore(queue_url, create=False)
    try:
        records, refused = trusted_records(store, admin_token, require_bytes=False)
        source = store.safe_url
    finally:
        store.close()
    doc = fit_report(records, floor, target=target, method=method)
    doc.update(queue=source, refused=refused, created_at=dt.datetime.now(dt.timezone.utc).isoformat(
        timespec="seconds"))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if doc["status"] == "ok":
        plot_reliability(doc, out_dir / "review_calibration.png")
        doc["plot"] = "review_calibration.png"
    # a crash never leaves a half-written report
    return atomic_write_json(out_dir / "review_calibration.json", doc, allow_nan=True)
