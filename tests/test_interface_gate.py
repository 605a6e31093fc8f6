"""The gate's ipSAE check (issue 43): `low_ipsae` names each weak chain pair, `min_ipsae` is
validated, fitted from reviewed complexes like `min_iptm` and applied with the floor kept."""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest

from protdp.gating import GatePolicy
from protdp.gating import route as route_module
from protdp.gating.policy import load_reviewed_policy
from protdp.gating.reasons import REASON_TEXT
from protdp.gating.route import route
from protdp.safety import interface_calibration as ic


def _rows(values: dict) -> list[dict]:
    return [{"chain_1": a, "chain_2": b, "type": "max", "ipsae": v}
            for (a, b), v in values.items()] + [{"chain_1": "A", "chain_2": "B", "type": "asym",
                                                 "ipsae": 0.0}]        # asym rows never gate


def _decide(rows, policy=None):
    return route(np.full(20, 90.0), length=20, msa_depth=100, training_crop=None,
                 policy=policy or GatePolicy(), sequence="ACDEFGHIKLMNPQRSTVWY",
                 interface={"iptm": 0.9, "interface_pae": 3.0, "interface_scores": rows})


def test_low_ipsae_names_the_weak_pairs():
    ok = _decide(_rows({("A", "B"): 0.8, ("A", "C"): 0.7}))
    assert ok.route == "accepted" and ok.reasons == []
    weak = _decide(_rows({("A", "B"): 0.8, ("A", "C"): 0.312, ("B", "C"): None}))
    assert weak.route == "needs_review" and weak.reasons == ["low_ipsae"]
    assert weak.details["low_ipsae"] == ("chains A-C ipSAE 0.312 < 0.5; "
                                         "chains B-C ipSAE n/a < 0.5")
    assert "low_ipsae" in REASON_TEXT
    strict = _decide(_rows({("A", "B"): 0.8}), GatePolicy(min_ipsae=0.85))
    assert strict.reasons == ["low_ipsae"]
    assert _decide(None).reasons == []            # a complex scored before issue 43: no check
    with pytest.raises(ValueError, match="min_ipsae"):
        GatePolicy(min_ipsae=1.5)


def test_route_functions_are_short():
    """Issue 48: `route` was 94 lines; every function of gating/route.py is under 80."""
    tree = ast.parse(inspect.getsource(route_module))
    lengths = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
               if isinstance(n, ast.FunctionDef)}
    assert lengths and max(lengths.values()) < 80, lengths


def ipsae_reviews(n: int, cut: float, seed: int = 0) -> list[dict]:
    """Reviewed complexes whose verdicts follow P(approve) = sigmoid(20 (ipSAE - cut)) of the
    weakest of their two chain pairs."""
    rng = np.random.default_rng(seed)
    weakest = rng.uniform(0.05, 0.95, n)
    approve = rng.random(n) < 1 / (1 + np.exp(-20 * (weakest - cut)))
    chains = [{"chain_id": c} for c in "ABC"]
    return [{"decision": "approved" if approve[i] else "rejected",
             "scores": {"chains": chains, "iptm": 0.8, "interface_pae": 5.0,
                        "interface_scores": _rows({("A", "B"): float(weakest[i]),
                                                   ("A", "C"): min(1.0, weakest[i] + 0.2)})}}
            for i in range(n)]


def test_min_ipsae_is_fitted_from_reviews_and_floor_kept(tmp_path):
    records = ipsae_reviews(200, cut=0.6)
    fit = ic.fit_ipsae(records, GatePolicy(), target=0.1)
    assert fit["status"] == "ok" and fit["counts"]["decisions"] == 200
    t = fit["min_ipsae"]
    assert 0.6 < t <= 0.85 and fit["worst_reject_probability"] <= 0.1
    assert 1 / (1 + np.exp(-20 * (t - 0.6))) > 0.8                      # the truth agrees
    assert fit["approval_rate_at_or_above"] > 0.85 > fit["approval_rate_below"]
    stricter = ic.fit_ipsae(ipsae_reviews(200, cut=0.75, seed=1), GatePolicy(), target=0.1)
    assert stricter["min_ipsae"] >= t + 0.08
    assert ic.fit_ipsae(records, GatePolicy(min_ipsae=0.95), target=0.1)["min_ipsae"] >= 0.95
    few = ic.fit_ipsae(records[:10], GatePolicy(), target=0.1)
    assert few["status"] == "insufficient_reviews"
    old = [{**r, "scores": {k: v for k, v in r["scores"].items() if k != "interface_scores"}}
           for r in records]
    assert ic.fit_ipsae(old, GatePolicy(), target=0.1)["status"] == "no_complexes"
    # the complex report carries it into the policy; load_reviewed_policy applies it
    report = ic.fit_complex_report(records, GatePolicy(), target=0.1)
    assert report["policy"]["min_ipsae"] == t
    doc = {"format": "protdp-review-calibration-v1", "status": "insufficient_reviews",
           "complexes": report, "_sha256": "0" * 64}
    applied = load_reviewed_policy(tmp_path / "r.json", GatePolicy(), doc=doc)
    assert applied.min_ipsae == t
    assert load_reviewed_policy(tmp_path / "r.json", GatePolicy(min_ipsae=0.99),
                                doc=doc).min_ipsae == 0.99
