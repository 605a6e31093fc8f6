"""Reviewed calibration of the gate's complex checks (issue 32): ipTM and interface PAE, and
(issue 43, `fit_ipsae`) the weakest chain pair's ipSAE for `min_ipsae`.

The same method as the pLDDT part (`review_calibration`), on the held-out complexes of a
review queue: every approved or rejected item whose scores name at least two chains (a
complex predicted by AlphaFold-Multimer, `protdp predict` with a multimer checkpoint). A
logistic regression on standardised (ipTM, interface PAE) fits P(reviewer approves); the
proposed thresholds (`min_iptm`, `max_interface_pae`) are those for which *every* complex the
gate would accept on these two inputs (ipTM in [min_iptm, 1], interface PAE in
[0, max_interface_pae]) has a predicted rejection probability at most the target. The model is
monotone in each input, so the worst accepted complex is a corner of that box. The configured
policy is the floor (min_iptm only goes up, max_interface_pae only down); among the safe
candidates the one accepting the most reviewed complexes wins (then the lowest min_iptm).
With fewer than MIN_REVIEWS complex decisions, or fewer than MIN_PER_CLASS of either verdict,
the report says so and the complex checks stay as configured. Each input is also reported on
its own: the reviewers' approval rate of the complexes at / beyond its proposed threshold.
"""

from __future__ import annotations

import numpy as np

from protdp.gating import GatePolicy
from protdp.interface.complex import weakest_pair_ipsae
from protdp.safety.reviewed import decided_table

INPUTS = ("iptm", "interface_pae")
IPTM_STEP = 0.01                 # min_iptm grid
PAE_STEP = 0.5                   # max_interface_pae grid (Å)
MIN_PAE = 1.0                    # tightest interface-PAE threshold considered (Å)


def complex_table(records: list[dict]) -> dict:
    """(ipTM, interface PAE) X [N, 2], approved y [N] of the decided complexes; monomers are
    not counted, escalations and complexes without both scores are counted as skipped."""
    def values_of(rec):
        scores = rec.get("scores") or {}
        chains = scores.get("chains")
        if not isinstance(chains, list) or len(chains) < 2:
            return None
        return [scores.get(k) for k in INPUTS]

    return decided_table(records, values_of, len(INPUTS))


def make_model():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000))


def corners(t_iptm: float, t_pae: float) -> np.ndarray:
    """The acceptance box's corners [4, 2]: ipTM in {t_iptm, 1}, interface PAE in {0, t_pae}."""
    return np.array([[a, b] for a in (t_iptm, 1.0) for b in (0.0, t_pae)])


def propose(model, X: np.ndarray, floor: GatePolicy, target: float) -> dict:
    iptms = np.arange(floor.min_iptm, 1.0 + 1e-9, IPTM_STEP)
    paes = sorted({floor.max_interface_pae,
                   *np.arange(MIN_PAE, floor.max_interface_pae, PAE_STEP).tolist()}, reverse=True)
    # worst predicted rejection of every (t_pae, t_iptm) box at once: one model call
    boxes = np.array([corners(a, b) for b in paes for a in iptms])          # [P*I, 4, 2]
    worst = 1.0 - model.predict_proba(boxes.reshape(-1, 2))[:, 1].reshape(len(paes),
                                                                          len(iptms), 4).min(-1)
    best = None
    for i, t_pae in enumerate(paes):
        safe = np.nonzero(worst[i] <= target)[0]
        if not len(safe):
            continue
        t_iptm = float(iptms[safe[0]])      # higher ipTM thresholds only accept fewer
        inside = (X[:, 0] >= t_iptm) & (X[:, 1] <= t_pae)
        key = (int(inside.sum()), -t_iptm, t_pae)
        if best is None or key > best[0]:
            best = (key, t_iptm, float(t_pae), float(worst[i, safe[0]]), inside)
    if best is None:
        return {"achievable": False, "min_iptm": 1.0,
                "max_interface_pae": floor.max_interface_pae, "worst_reject_probability": None,
                "reviewed_in_region": 0}
    _, t_iptm, t_pae, worst, inside = best
    return {"achievable": True, "min_iptm": round(t_iptm, 4), "max_interface_pae": t_pae,
            "worst_reject_probability": worst, "reviewed_in_region": int(inside.sum()),
            "inside_mask": inside}


def _rate(mask: np.ndarray, y: np.ndarray) -> float | None:
    return float(y[mask].mean()) if mask.any() else None


def _cannot_fit(doc: dict, table: dict, counts: dict, none_message: str, noun: str,
                left_alone: str) -> bool:
    """Whether `table` (`decided_table`) is unfit for a model; if so `doc` gets status
    "no_complexes" (nothing decided nor skipped: `none_message`) or "insufficient_reviews"
    (`too_few_reviews` of `counts`, naming `noun` and what is `left_alone`)."""
    from protdp.safety.reviewed import too_few_reviews

    if not len(table["y"]) and not sum(table["skipped"].values()):
        doc.update(status="no_complexes", message=none_message)
        return True
    shortfall = too_few_reviews(counts, noun, left_alone)
    if shortfall:
        doc.update(status="insufficient_reviews", message=shortfall)
        return True
    return False


def fit_complex_report(records: list[dict], floor: GatePolicy, *, target: float) -> dict:
    """The complex part of the reviewed calibration (status "ok", "no_complexes" or
    "insufficient_reviews")."""
    from protdp.safety.reviewed import decision_counts, reliability

    table = complex_table(records)
    X, y = table["X"], table["y"]
    counts = decision_counts(table)
    doc = {"inputs": list(INPUTS), "counts": counts, "target_reject_rate": target,
           "floor": {"min_iptm": floor.min_iptm, "max_interface_pae": floor.max_interface_pae}}
    if _cannot_fit(doc, table, counts, "no reviewed complexes in the queue; the complex "
                   "checks are left as configured", "complexes", "the complex checks are"):
        return doc
    model = make_model().fit(X, y)
    proposal = propose(model, X, floor, target)
    inside = proposal.pop("inside_mask", np.zeros(len(y), bool))
    p = model.predict_proba(X)[:, 1]
    proposal["expected_reject_rate_in_region"] = float(1 - p[inside].mean()) if inside.any() \
        else None
    proposal["observed_reject_rate_in_region"] = float((~y[inside]).mean()) if inside.any() \
        else None
    per_input = {
        "iptm": {"threshold": proposal["min_iptm"], "floor": floor.min_iptm,
                 "approval_rate_at_or_above": _rate(X[:, 0] >= proposal["min_iptm"], y),
                 "approval_rate_below": _rate(X[:, 0] < proposal["min_iptm"], y)},
        "interface_pae": {"threshold": proposal["max_interface_pae"],
                          "floor": floor.max_interface_pae,
                          "approval_rate_at_or_below": _rate(
                              X[:, 1] <= proposal["max_interface_pae"], y),
                          "approval_rate_above": _rate(X[:, 1] > proposal["max_interface_pae"], y)}}
    ipsae = fit_ipsae(records, floor, target=target)                  # issue 43
    if ipsae["status"] == "ok":
        proposal["min_ipsae"] = ipsae["min_ipsae"]
    scaler, lr = model[0], model[1]
    doc.update(status="ok", policy=proposal, per_input=per_input, ipsae=ipsae,
               reliability=reliability(y, _cross_validated(X, y)),
               model={"inputs": list(INPUTS), "coef_standardised": lr.coef_[0].tolist(),
                      "intercept": float(lr.intercept_[0]), "mean": scaler.mean_.tolist(),
                      "scale": scaler.scale_.tolist()})
    return doc


IPSAE_STEP = 0.01                # min_ipsae grid


def fit_ipsae(records: list[dict], floor: GatePolicy, *, target: float) -> dict:
    """`min_ipsae` fitted as `min_iptm` is (issue 43): a logistic regression of P(approved) on
    the weakest pair's ipSAE of each decided complex; the proposed threshold is the lowest one
    on a 0.01 grid, not below the configured floor, at which the predicted rejection
    probability is at most `target` (the model is monotone, so the threshold itself is the
    worst accepted value). Status "ok", "no_complexes" or "insufficient_reviews"."""
    from protdp.safety.reviewed import decision_counts

    def values_of(rec):
        scores = rec.get("scores") or {}
        if not isinstance(scores.get("chains"), list) or len(scores["chains"]) < 2 \
                or not scores.get("interface_scores"):
            return None
        return [weakest_pair_ipsae(scores["interface_scores"])]

    table = decided_table(records, values_of, 1)
    X, y = table["X"], table["y"]
    counts = decision_counts(table)
    doc = {"input": "weakest pair ipSAE", "counts": counts, "target_reject_rate": target,
           "floor": {"min_ipsae": floor.min_ipsae}}
    if _cannot_fit(doc, table, counts, "no reviewed complexes with interface scores; "
                   "min_ipsae is left as configured", "complexes with interface scores",
                   "min_ipsae is"):
        return doc
    model = make_model().fit(X, y)
    grid = np.arange(floor.min_ipsae, 1.0 + 1e-9, IPSAE_STEP)                  # [G]
    reject = 1.0 - model.predict_proba(grid[:, None])[:, 1]                     # [G]
    safe = np.nonzero(reject <= target)[0]
    t = float(grid[safe[0]]) if len(safe) else 1.0
    doc.update(status="ok", achievable=bool(len(safe)), min_ipsae=round(t, 4),
               worst_reject_probability=float(reject[safe[0]]) if len(safe) else None,
               approval_rate_at_or_above=_rate(X[:, 0] >= t, y),
               approval_rate_below=_rate(X[:, 0] < t, y))
    return doc


def _cross_validated(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    folds = StratifiedKFold(n_splits=min(5, int(y.sum()), int((~y).sum())), shuffle=True,
                            random_state=0)
    return cross_val_predict(make_model(), X, y, cv=folds, method="predict_proba")[:, 1]
