"""Calibration report (protdp.safety.calibration): statistics against hand-computed values, and
`protdp calibrate` end to end on a store built from real families of ../shared/data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_fixtures import build_pairs_store
from protdp.errors import InputError
from protdp.gating import GatePolicy, load_calibrated_policy, route
from protdp.safety import calibration as cal
from protdp.safety import cli as safety_cli

SMALL_PAIRS = ("7a4d_E", "2p90_A02", "2q2k_A", "5awl_A")


def test_gate_threshold_lowest_safe_value():
    mean_plddt = np.array([95.0, 85.0, 80.0, 60.0, 40.0])
    true = np.array([0.9, 0.8, 0.5, 0.75, 0.2])
    # >=95: 0.9; >=85: 0.85; >=80: 0.733; >=60: 0.7375; >=40: 0.63
    r = cal.gate_threshold(mean_plddt, true, 0.7)
    assert r["accept_mean_plddt"] == 60.0 and r["achievable"]
    assert r["n_accepted"] == 4 and r["coverage"] == pytest.approx(0.8)
    assert r["accepted_mean_lddt"] == pytest.approx((0.9 + 0.8 + 0.5 + 0.75) / 4)
    # stricter target: >=80 fails (0.733 < 0.8), so lowering further is not allowed even though
    # a lower threshold could average back up
    r = cal.gate_threshold(mean_plddt, true, 0.8)
    assert r["accept_mean_plddt"] == 85.0 and r["n_accepted"] == 2
    r = cal.gate_threshold(mean_plddt, true, 0.95)
    assert not r["achievable"] and r["accept_mean_plddt"] == 100.0 and r["n_accepted"] == 0


def test_band_table_and_spearman():
    plddt = np.array([95.0, 91.0, 90.0, 70.0, 69.9, 50.0, 10.0])
    true = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.1])
    bands = cal.band_table(plddt, true)
    assert bands["very_high"]["residues"] == 2 and bands["very_high"]["mean_true_lddt"] == pytest.approx(85.0)
    assert bands["confident"]["residues"] == 2 and bands["confident"]["mean_true_lddt"] == pytest.approx(65.0)
    assert bands["low"]["residues"] == 2 and bands["very_low"]["residues"] == 1
    assert cal.spearman(plddt, true) == pytest.approx(1.0)
    assert cal.spearman(plddt, -true) == pytest.approx(-1.0)
    assert cal.spearman(np.full(5, 50.0), np.arange(5.0)) is None
    rel = cal.reliability_curve(plddt, true)
    assert sum(r["residues"] for r in rel) == len(plddt)
    assert [r["lo"] for r in rel] == [10.0, 50.0, 60.0, 70.0, 90.0]


@pytest.fixture(scope="session")
def small_store(tmp_path_factory, data_dir):
    from protdp.data.store import FamilyStore
    path = build_pairs_store(data_dir, SMALL_PAIRS, tmp_path_factory.mktemp("calib_store"))
    with FamilyStore(path) as store:
        assert len(store.family_ids) >= 3
    return path


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Tiny model whose pLDDT head is randomised (the zero-initialised head would predict a
    constant 50), saved with the predictor's single-file format."""
    from protdp.inference.checkpoint import save_model_checkpoint
    from protdp.model import build_model
    torch.manual_seed(0)
    model = build_model("configs/model/tiny.yaml", verbose=False)
    with torch.no_grad():
        model.plddt_head.linear_3.weight.normal_(0.0, 2.0)
        model.plddt_head.linear_3.bias.normal_(0.0, 2.0)
    path = tmp_path_factory.mktemp("calib_ckpt") / "tiny.pt"
    return save_model_checkpoint(model, model.config, path, training_crop=64, max_msa_rows=16)


def test_calibrate_end_to_end(small_store, tiny_checkpoint, capsys):
    from protdp.data.store import FamilyStore
    from protdp.metrics import lddt_ca
    rc = safety_cli.calibrate(["--checkpoint", str(tiny_checkpoint), "--data", str(small_store),
                   "--target-lddt", "0.05", "--max-msa-rows", "8", "--num-recycles", "0"])
    assert rc == 0
    out_dir = tiny_checkpoint.parent                       # written next to the checkpoint
    doc = json.loads((out_dir / "calibration.json").read_text())
    png = out_dir / doc["plot"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    with FamilyStore(small_store) as store:
        fams = list(store.family_ids)
        observed = sum(int(np.asarray(store.read(f)["backbone_mask"])[:, 1].sum()) for f in fams)
    assert doc["families"] == fams and doc["n_targets"] == len(fams)
    assert doc["n_residues"] == observed
    assert sum(b["residues"] for b in doc["bands"].values()) == observed
    assert sum(b["targets"] for b in doc["bands_by_target"].values()) == len(fams)
    assert "warning" in doc                                   # 3-4 targets is far too few
    # the per-target true lDDT is the real metric on the model's own prediction: re-run one
    from protdp.data.features import collate, featurize
    from protdp.inference.checkpoint import load_model_checkpoint
    loaded = load_model_checkpoint(tiny_checkpoint)
    with FamilyStore(small_store) as store:
        fam = store.read(fams[0])
    with torch.no_grad():
        pred = loaded.model(collate([featurize(fam, crop_size=None, max_msa_rows=8, seed=0,
                                               training=False)]), num_recycles=0)
    want = lddt_ca(pred["final_atom_positions"][0, :, 1], fam["backbone_positions"][:, 1],
                   fam["backbone_mask"][:, 1])
    got = next(t for t in doc["per_target"] if t["family_id"] == fams[0])
    assert got["lddt_ca"] == pytest.approx(want, rel=1e-6)
    assert got["mean_plddt"] == pytest.approx(float(pred["plddt"][0].mean()), rel=1e-6)
    # threshold consistent with the per-target numbers it was derived from
    thr = doc["threshold"]
    accepted = [t for t in doc["per_target"] if t["mean_plddt"] >= thr["accept_mean_plddt"]]
    if thr["achievable"]:
        assert np.mean([t["lddt_ca"] for t in accepted]) >= 0.05
    assert "gate threshold" in capsys.readouterr().out


def test_gate_loads_calibrated_policy(tmp_path):
    report = {"format": cal.CALIBRATION_FORMAT, "threshold": {"accept_mean_plddt": 83.5}}
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(report))
    base = GatePolicy(min_msa_depth=5)
    policy = load_calibrated_policy(path, base)
    assert policy.accept_mean_plddt == 83.5 and policy.min_msa_depth == 5
    plddt = np.full(20, 80.0)
    kw = dict(length=20, msa_depth=50, training_crop=64)
    assert route(plddt, policy=base, **kw).route == "accepted"
    assert route(plddt, policy=policy, **kw).route == "needs_review"
    loose = dict(report, threshold={**report["threshold"], "accept_mean_plddt": 40.0})
    path.write_text(json.dumps(loose))
    assert load_calibrated_policy(path, base).accept_mean_plddt == base.accept_mean_plddt
    path.write_text(json.dumps({"format": cal.CALIBRATION_FORMAT, "threshold": {"accept_mean_plddt": "x"}}))
    with pytest.raises(InputError, match="threshold.accept_mean_plddt"):
        load_calibrated_policy(path, base)
    path.write_text("{not json")
    with pytest.raises(InputError, match="calibration.json:1"):
        load_calibrated_policy(path)
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xf0\x9f\x92")   # was a UnicodeDecodeError
    with pytest.raises(InputError, match="calibration.json: not a calibration report: not UTF-8"):
        load_calibrated_policy(path)


def test_calibrate_rejects_unknown_family(small_store, tiny_checkpoint, tmp_path):
    with pytest.raises(InputError, match="families not in the store"):
        safety_cli.calibrate(["--checkpoint", str(tiny_checkpoint), "--data", str(small_store),
                  "--out", str(tmp_path), "--families", "nope_X"])


def test_predict_uses_calibration_beside_checkpoint(tiny_checkpoint, tmp_path, capsys):
    """`protdp predict` tightens the gate with CHECKPOINT_DIR/calibration.json when present."""
    import shutil

    from protdp.inference import cli as predict_cli
    ckpt = tmp_path / "ckpt" / "tiny.pt"
    ckpt.parent.mkdir()
    shutil.copy(tiny_checkpoint, ckpt)
    (ckpt.parent / "calibration.json").write_text(json.dumps(
        {"format": cal.CALIBRATION_FORMAT, "threshold": {"accept_mean_plddt": 97.5}}))
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">t1\nMKTAYIAKQRQISFVKSHFSRQ\n")
    out = tmp_path / "out"
    assert predict_cli.main(["--allow-unreleased", "--checkpoint", str(ckpt), "--fasta", str(fasta),
                             "--out", str(out),
                             "--no-progress"]) == 0
    assert "mean pLDDT >= 97.5 (calibrated" in capsys.readouterr().out
    prov = json.loads(next(out.glob("targets/*/*/provenance.json")).read_text())
    assert "97.5" in json.dumps(prov)


def test_calibrate_defaults_to_the_runs_validation_split(small_store, tiny_checkpoint,
                                                         tmp_path, monkeypatch):
    """Issue 28: for a training run, calibrate (like release) evaluates the run's validation
    split by default, not every family of the store including the training ones."""
    from types import SimpleNamespace

    from protdp.data.store import FamilyStore
    from protdp.train import checkpointing
    from protdp.train.args import TrainArgs
    from protdp.train.trainer import split_families

    meta = {"config": {"data": str(small_store), "val_fraction": 0.34, "seed": 3}}
    monkeypatch.setattr(checkpointing, "read_any_weights", lambda _: SimpleNamespace(meta=meta))
    path = cal.calibrate(tiny_checkpoint, small_store, tmp_path, max_msa_rows=8, num_recycles=0)
    with FamilyStore(small_store) as store:
        ids = list(store.family_ids)
    want = split_families(ids, TrainArgs(data=str(small_store), val_fraction=0.34, seed=3))[1]
    assert json.loads(path.read_text())["families"] == want and 0 < len(want) < len(ids)
