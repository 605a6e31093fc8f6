"""Reviewers' decisions fed back into the gate: `protdp calibrate --from-reviews QUEUE_URL`
on a real queue whose decisions follow a known approval model, the guarantee re-checked
independently from the report, the floor, too few reviews, and `protdp predict` applying the
reviewed calibration (recorded in provenance.json)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
import yaml
from review_fixtures import queue_with, sqlite_url  # noqa: F401

from protdp.cli import main as protdp_main
from protdp.errors import InputError
from protdp.gating import CalibratedGatePolicy, GatePolicy, load_calibrated_policy, route
from protdp.gating.policy import REVIEWED_CALIBRATION_FORMAT, load_reviewed_policy
from protdp.safety import review_calibration as rc
from protdp.inference.layout import current_prediction


@pytest.fixture(autouse=True)
def _admin_env(monkeypatch):
    """reviewed_queue sets the admin token in the environment; undone after each test."""
    monkeypatch.setenv("PROTDP_REVIEW_ADMIN_TOKEN", "")


def true_approval(mean, vlf, depth):
    """The reviewers' behaviour the synthetic queue follows (length plays no part)."""
    logit = 0.3 * (mean - 78.0) + 1.2 * (np.log1p(depth) - np.log1p(30)) - 6.0 * (vlf - 0.1)
    return 1.0 / (1.0 + np.exp(-logit))


def reviewed_queue(url: str, n: int, seed: int = 0) -> dict:
    """A real queue with `n` decided items whose verdicts follow `true_approval`."""
    rng = np.random.default_rng(seed)
    from protdp.review.store import ReviewStore
    store = ReviewStore(url)
    admin_token = store.init_admin()
    os.environ["PROTDP_REVIEW_ADMIN_TOKEN"] = admin_token   # calibrate reads as the admin
    tokens = {"alice": store.admin(admin_token).add_reviewer("alice")}
    alice = store.reviewer(tokens["alice"])
    mean = rng.uniform(40, 99, n)
    vlf = np.clip(rng.normal((90 - mean) / 150, 0.05), 0, 1)
    depth = np.round(np.exp(rng.uniform(0, np.log(600), n))).astype(int)
    length = rng.integers(40, 600, n)
    approve = rng.random(n) < true_approval(mean, vlf, depth)
    for i in range(n):
        item_id = store.enqueue(f"run/{i}", f"t{i}", {
            "mean_plddt": float(mean[i]), "very_low_fraction": float(vlf[i]),
            "msa_depth": int(depth[i]), "length": int(length[i])}, {}, ["low_mean_plddt"])
        if approve[i]:
            alice.decide(item_id, "approve")
        else:
            alice.decide(item_id, "reject", "reviewer disagrees with the fold")
    extra = store.enqueue("run/esc", "esc", {"mean_plddt": 50.0}, {}, ["low_mean_plddt"])
    alice.decide(extra, "escalate", "ask a crystallographer")  # no verdict: left out
    store.close()
    return {"mean": mean, "vlf": vlf, "depth": depth, "length": length, "approve": approve}


def _fitted_reject(doc: dict, X: np.ndarray) -> np.ndarray:
    """P(reject) recomputed from the report's own model description (not from sklearn)."""
    m = doc["model"]
    z = (rc.design(X) - np.array(m["mean"])) / np.array(m["scale"])
    return 1.0 - 1.0 / (1.0 + np.exp(-(z @ np.array(m["coef_standardised"]) + m["intercept"])))


def test_calibrate_from_reviews_end_to_end(sqlite_url, tmp_path, capsys):
    truth = reviewed_queue(sqlite_url, 400)
    out = tmp_path / "cal"
    assert protdp_main(["calibrate", "--from-reviews", sqlite_url, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "400 reviewed decisions" in printed and "1 escalated" in printed
    doc = json.loads((out / "review_calibration.json").read_text())
    assert doc["format"] == REVIEWED_CALIBRATION_FORMAT and doc["status"] == "ok"
    assert doc["counts"]["approved"] == int(truth["approve"].sum())
    pol = doc["policy"]
    assert pol["achievable"] and pol["accept_mean_plddt"] >= 70.0     # the configured floor
    assert pol["max_very_low_fraction"] <= 0.25 and pol["min_msa_depth"] >= 30
    # the guarantee, re-checked on a dense grid of predictions the proposed gate would accept
    grid = np.array(np.meshgrid(np.linspace(pol["accept_mean_plddt"], 100, 15),
                                np.linspace(0, pol["max_very_low_fraction"], 6),
                                np.geomspace(pol["min_msa_depth"], truth["depth"].max(), 8),
                                np.linspace(truth["length"].min(), truth["length"].max(), 5),
                                indexing="ij")).reshape(4, -1).T
    fitted = _fitted_reject(doc, grid)
    assert fitted.max() <= doc["target_reject_rate"] + 1e-9
    assert fitted.max() == pytest.approx(pol["worst_reject_probability"], abs=1e-6)
    # ... and against the reviewers' real behaviour: the accepted set stays near the target
    true_reject = 1 - true_approval(grid[:, 0], grid[:, 1], grid[:, 2])
    assert true_reject.mean() < 0.02 and true_reject.max() < 0.08
    # the fit recovers the direction of every effect, and is calibrated out of sample
    coef = dict(zip(doc["model"]["inputs"], doc["model"]["coef_standardised"]))
    assert coef["mean_plddt"] > 0 and coef["log1p(msa_depth)"] > 0
    assert coef["very_low_fraction"] < 0 and abs(coef["log1p(length)"]) < coef["mean_plddt"] / 3
    rel = doc["reliability"]
    assert rel["auc"] > 0.85 and rel["brier"] < 0.15
    gaps = [abs(b["predicted"] - b["observed"]) for b in rel["bins"]]
    assert np.mean(gaps) < 0.12
    png = out / doc["plot"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # isotonic on mean pLDDT alone is offered too
    assert protdp_main(["calibrate", "--from-reviews", sqlite_url, "--out", str(tmp_path / "iso"),
                        "--method", "isotonic"]) == 0
    iso = json.loads((tmp_path / "iso" / "review_calibration.json").read_text())
    assert iso["status"] == "ok" and iso["policy"]["accept_mean_plddt"] >= 70.0
    assert np.all(np.diff(iso["model"]["p_approve"]) >= 0)


def test_the_configured_floor_is_never_loosened(sqlite_url, tmp_path):
    reviewed_queue(sqlite_url, 200, seed=1)
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump({"accept_mean_plddt": 95.0, "max_very_low_fraction": 0.05,
                                      "min_msa_depth": 100}))
    assert protdp_main(["calibrate", "--from-reviews", sqlite_url, "--out", str(tmp_path),
                        "--gating", str(strict), "--target-reject-rate", "0.2"]) == 0
    pol = json.loads((tmp_path / "review_calibration.json").read_text())["policy"]
    assert pol["accept_mean_plddt"] >= 95.0 and pol["max_very_low_fraction"] <= 0.05
    assert pol["min_msa_depth"] >= 100


def test_too_few_reviews_change_nothing(sqlite_url, tmp_path, capsys):
    reviewed_queue(sqlite_url, 12)
    assert protdp_main(["calibrate", "--from-reviews", sqlite_url, "--out", str(tmp_path)]) == 0
    assert "too few reviews" in capsys.readouterr().out
    path = tmp_path / "review_calibration.json"
    doc = json.loads(path.read_text())
    assert doc["status"] == "insufficient_reviews" and "policy" not in doc
    base = GatePolicy()
    assert load_calibrated_policy(path, base) is base
    assert not (tmp_path / "review_calibration.png").exists()
    with pytest.raises(InputError, match="target-reject-rate"):
        rc.fit_report([], base, target=1.5)


def test_reviewed_policy_only_tightens(tmp_path):
    path = tmp_path / "review_calibration.json"
    base = GatePolicy(accept_mean_plddt=75.0, max_very_low_fraction=0.2, min_msa_depth=40)

    def write(policy):
        path.write_text(json.dumps({"format": REVIEWED_CALIBRATION_FORMAT, "status": "ok",
                                    "policy": policy}))

    write({"accept_mean_plddt": 82.5, "max_very_low_fraction": 0.1, "min_msa_depth": 64})
    tight = load_reviewed_policy(path, base)
    assert isinstance(tight, CalibratedGatePolicy)
    assert (tight.accept_mean_plddt, tight.max_very_low_fraction, tight.min_msa_depth) == \
        (82.5, 0.1, 64)
    rec = tight.calibrations[0]
    assert rec["format"] == REVIEWED_CALIBRATION_FORMAT and len(rec["sha256"]) == 64
    write({"accept_mean_plddt": 10.0, "max_very_low_fraction": 0.9, "min_msa_depth": 1})
    loose = load_reviewed_policy(path, base)
    assert (loose.accept_mean_plddt, loose.max_very_low_fraction, loose.min_msa_depth) == \
        (75.0, 0.2, 40)
    plddt = np.full(50, 80.0)
    kw = dict(length=50, msa_depth=50, training_crop=256)
    assert route(plddt, policy=base, **kw).route == "accepted"
    assert route(plddt, policy=tight, **kw).route == "needs_review"
    write({"accept_mean_plddt": "high", "max_very_low_fraction": 0.1, "min_msa_depth": 1})
    with pytest.raises(InputError, match="policy.accept_mean_plddt"):
        load_reviewed_policy(path, base)


def test_predict_applies_the_reviewed_calibration_and_records_it(sqlite_url, tmp_path, capsys):
    from protdp.inference.checkpoint import save_model_checkpoint
    from protdp.model import build_model
    from protdp.resources import config_file

    reviewed_queue(sqlite_url, 200, seed=2)
    torch.manual_seed(0)
    ckpt = save_model_checkpoint(build_model(config_file("model/tiny.yaml"), verbose=False), None,
                                 tmp_path / "ckpt" / "tiny.pt")
    assert protdp_main(["calibrate", "--from-reviews", sqlite_url, "--checkpoint", str(ckpt)]) == 0
    cal = ckpt.parent / "review_calibration.json"           # beside the checkpoint
    doc = json.loads(cal.read_text())
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">t1\nMKTAYIAKQRQISFVKSHFSRQ\n")
    out = tmp_path / "out"
    capsys.readouterr()
    assert protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out",
                        str(out), "--no-progress", "--allow-unreleased"]) == 0
    assert f"(calibrated: {cal})" in capsys.readouterr().out
    prov = json.loads((current_prediction(out / "targets" / "t1") / "provenance.json").read_text())
    gate = prov["config"]["gate_policy"]
    assert gate["accept_mean_plddt"] == max(70.0, doc["policy"]["accept_mean_plddt"])
    assert gate["min_msa_depth"] == max(30, doc["policy"]["min_msa_depth"])
    [record] = gate["calibrations"]
    assert record["path"] == str(cal.resolve()) and record["format"] == REVIEWED_CALIBRATION_FORMAT
    # an explicit --calibration of the other kind still picks this one up from beside the ckpt
    shutil.copy(cal, tmp_path / "explicit.json")
    capsys.readouterr()
    assert protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out",
                        str(tmp_path / "out2"), "--no-progress", "--allow-unreleased", "--calibration",
                        str(tmp_path / "explicit.json")]) == 0
    prov = json.loads((current_prediction(tmp_path / "out2" / "targets" / "t1") / "provenance.json").read_text())
    assert [c["path"] for c in prov["config"]["gate_policy"]["calibrations"]] == [
        str((tmp_path / "explicit.json").resolve())]


def test_from_reviews_never_creates_or_touches_a_non_queue(tmp_path, capsys):
    import sqlite3

    missing = tmp_path / "typo.sqlite"
    assert protdp_main(["calibrate", "--from-reviews", str(missing), "--out", str(tmp_path)]) == 2
    assert "no review queue" in capsys.readouterr().err and not missing.exists()
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    assert protdp_main(["calibrate", "--from-reviews", str(other), "--out", str(tmp_path)]) == 2
    assert "is not a review queue" in capsys.readouterr().err
    tables = sqlite3.connect(other).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("t",)]
    assert not (tmp_path / "review_calibration.json").exists()


def complex_reviews(n: int, cut: float, seed: int = 0) -> tuple[list[dict], dict]:
    """Reviewed complexes (issue 32) whose verdicts follow P(approve) = sigmoid(20 (ipTM - cut)):
    (records as the queue exports them, the truth); interface PAE falls with ipTM."""
    rng = np.random.default_rng(seed)
    iptm = rng.uniform(0.2, 0.98, n)
    ipae = np.clip(30 * (1 - iptm) + rng.normal(0, 2, n), 0.5, 31)
    approve = rng.random(n) < 1 / (1 + np.exp(-20 * (iptm - cut)))
    chains = [{"chain_id": "A", "start": 0, "end": 50, "length": 50},
              {"chain_id": "B", "start": 50, "end": 90, "length": 40}]
    records = [{"decision": "approved" if approve[i] else "rejected", "mean_plddt": 85.0,
                "very_low_fraction": 0.0, "msa_depth": 100, "length": 90,
                "scores": {"chains": chains, "iptm": float(iptm[i]),
                           "interface_pae": float(ipae[i])}} for i in range(n)]
    return records, {"iptm": iptm, "ipae": ipae, "approve": approve}


def test_reviewed_complexes_calibrate_iptm_and_interface_pae(sqlite_url, tmp_path, capsys):
    """Held-out complexes in a real queue: `calibrate --from-reviews` proposes min_iptm and
    max_interface_pae the way it proposes the pLDDT thresholds; the guarantee re-checked from
    the report's own model; reviewers who are stricter about the interface move min_iptm up;
    `load_reviewed_policy` applies them (floor kept); monomer-only reviews leave them alone."""
    from protdp.review.store import ReviewStore
    from protdp.safety import interface_calibration as ic

    queued, _ = complex_reviews(60, cut=0.65, seed=2)
    store = ReviewStore(sqlite_url)
    admin_token = store.init_admin()
    os.environ["PROTDP_REVIEW_ADMIN_TOKEN"] = admin_token
    alice = store.reviewer(store.admin(admin_token).add_reviewer("alice"))
    for i, rec in enumerate(queued):
        scores = {k: rec[k] for k in ("mean_plddt", "very_low_fraction", "msa_depth", "length")}
        item = store.enqueue(f"run/{i}", f"c{i}", {**scores, **rec["scores"]}, {}, ["low_iptm"])
        if rec["decision"] == "approved":
            alice.decide(item, "approve")
        else:
            alice.decide(item, "reject", "interface not plausible")
    store.close()
    out = tmp_path / "cal"
    assert protdp_main(["calibrate", "--from-reviews", sqlite_url, "--out", str(out),
                        "--target-reject-rate", "0.1"]) == 0
    assert "complexes (60 reviewed): proposed ipTM >=" in capsys.readouterr().out
    path = out / "review_calibration.json"
    cx = json.loads(path.read_text())["complexes"]
    assert cx["status"] == "ok" and cx["counts"]["decisions"] == 60
    # applied: the gate's complex checks tightened, recorded as a calibration
    policy = load_calibrated_policy(path, GatePolicy())
    assert isinstance(policy, CalibratedGatePolicy)
    assert policy.min_iptm == cx["policy"]["min_iptm"] > GatePolicy().min_iptm
    assert policy.max_interface_pae == cx["policy"]["max_interface_pae"]
    assert "min_iptm" in policy.calibrations[-1]["applied"]

    # more reviews, the thresholds and the guarantee in detail
    records, _ = complex_reviews(150, cut=0.65)
    cx = ic.fit_complex_report(records, GatePolicy(), target=0.1)
    pol = cx["policy"]
    assert pol["achievable"] and 0.7 <= pol["min_iptm"] <= 0.9        # cut 0.65 + the margin
    assert pol["max_interface_pae"] <= GatePolicy().max_interface_pae
    # the guarantee on a dense grid of the box the gate would accept, from the report's model
    m = cx["model"]
    grid = np.array(np.meshgrid(np.linspace(pol["min_iptm"], 1, 20),
                                np.linspace(0, pol["max_interface_pae"], 20),
                                indexing="ij")).reshape(2, -1).T
    z = (grid - np.array(m["mean"])) / np.array(m["scale"])
    reject = 1 - 1 / (1 + np.exp(-(z @ np.array(m["coef_standardised"]) + m["intercept"])))
    assert reject.max() <= 0.1 + 1e-9
    assert reject.max() == pytest.approx(pol["worst_reject_probability"], abs=1e-6)
    assert 1 / (1 + np.exp(-20 * (pol["min_iptm"] - 0.65))) > 0.8      # the truth agrees
    per = cx["per_input"]
    assert per["iptm"]["threshold"] == pol["min_iptm"]
    assert per["iptm"]["approval_rate_at_or_above"] > 0.85 > per["iptm"]["approval_rate_below"]
    # stricter reviewers (cut 0.8): min_iptm moves up; a strict floor is never loosened
    strict, _ = complex_reviews(150, cut=0.8, seed=1)
    moved = ic.fit_complex_report(strict, GatePolicy(), target=0.1)["policy"]
    assert moved["min_iptm"] >= pol["min_iptm"] + 0.08
    floor = GatePolicy(min_iptm=0.95, max_interface_pae=3.0)
    kept = ic.fit_complex_report(records, floor, target=0.1)["policy"]
    assert kept["min_iptm"] >= 0.95 and kept["max_interface_pae"] <= 3.0
    # monomers only: nothing to calibrate; too few complexes: left as configured
    mono = [{**r, "scores": {}} for r in records]
    assert ic.fit_complex_report(mono, GatePolicy(), target=0.1)["status"] == "no_complexes"
    few = ic.fit_complex_report(records[:12], GatePolicy(), target=0.1)
    assert few["status"] == "insufficient_reviews" and "policy" not in few


def _boundary_records(n: int, rejected: int) -> list[dict]:
    """n reviewed complexes, the `rejected` lowest-scoring ones rejected (features vary so
    both fits are well posed)."""
    chains = [{"chain_id": "A", "start": 0, "end": 50, "length": 50},
              {"chain_id": "B", "start": 50, "end": 90, "length": 40}]
    return [{"decision": "rejected" if i < rejected else "approved",
             "mean_plddt": 60.0 + i, "very_low_fraction": 0.3 - 0.01 * i,
             "msa_depth": 10 + 5 * i, "length": 90 + i,
             "scores": {"chains": chains, "iptm": 0.3 + 0.02 * i,
                        "interface_pae": 20.0 - 0.5 * i}} for i in range(n)]


def test_both_reports_share_the_too_few_reviews_guard():
    """The pLDDT and the complex report refuse to fit at the same counts (fewer than
    MIN_REVIEWS decisions, or fewer than MIN_PER_CLASS of a verdict), each with its message."""
    from protdp.safety import interface_calibration as ic

    n, k = rc.MIN_REVIEWS, rc.MIN_PER_CLASS
    cases = {(n, k): "ok", (n - 1, k): "insufficient_reviews", (n, k - 1): "insufficient_reviews",
             (n, n - k + 1): "insufficient_reviews"}      # too few approved
    for (total, rejected), status in cases.items():
        records = _boundary_records(total, rejected)
        doc = rc.fit_report(records, GatePolicy(), target=0.5)
        cx = doc["complexes"]
        assert doc["status"] == cx["status"] == status, (total, rejected)
        if status == "ok":
            assert "message" not in doc and "policy" in doc and "policy" in cx
            continue
        counts = f"({total - rejected} approved, {rejected} rejected)"
        need = f"need >= {n} with >= {k} of each"
        assert doc["message"] == (f"{total} reviewed decisions {counts}: {need}; the gate is "
                                  "left as configured")
        assert cx["message"] == (f"{total} reviewed complexes {counts}: {need}; the complex "
                                 "checks are left as configured")
        assert "policy" not in doc and "policy" not in cx
