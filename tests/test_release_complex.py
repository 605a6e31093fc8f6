"""`protdp release` of AlphaFold-Multimer checkpoints (protdp.safety.complex_release,
complex_redteam): the interface lDDT-Cα against an explicit double loop and known
perturbations; a tiny multimer model (the AlphaFold-Multimer fixture's random weights, as
`protdp weights import` writes them) laid out as a run fine-tuned on complexes is released on
its own validation split of a tiny complex store (the 2q2k homodimer), its training store
screened, the record read back; a deliberately overconfident copy is refused; `protdp predict`
routes complexes by the gate with the released one and refuses the other (or, with
--allow-unreleased, sends every complex to review)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from complex_fixtures import GOOD_ROWS, import_fixture_model, write_manifest
from protdp.cli import main as protdp_main
from protdp.errors import InputError
from protdp.gating.release import ReleasePolicy, weaker_thresholds
from protdp.inference.checkpoint import MULTIMER_KIND, MULTIMER_MODEL_FILE
from protdp.inference.layout import current_prediction
from protdp.complex.store import ComplexStore, build_complex_store
from protdp.complex.training import CA, complex_example
from protdp.safety.complex_release import interface_lddt_ca, score_complex
from protdp.safety.release import held_out, screening_check
from protdp.train.checkpointing import data_manifest
from protdp.train.release_record import MULTIMER_RECORD_KIND, read_release
from protdp.train.trainer import split_families

LAX = {"min_spearman_residue": -1.0, "min_mean_lddt_ca": 0.0, "max_ece": 1.0,
       "band_tolerance": 1000.0, "max_redteam_failures": 0, "min_targets": 1,
       "min_interface_lddt": 0.0, "max_iptm_error": 1.0}
COMPLEX_CHECKS = ["held_out_accuracy", "calibration_spearman", "calibration_ece",
                  "calibration_band_accuracy", "interface_accuracy", "iptm_calibration",
                  "gate_accepted_interfaces", "redteam", "training_data_screening"]
DIMER = "MKTAYIAKQRQISFVKSHFSRQLEER"          # a single-sequence homodimer to predict


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A complex store (4hhb, 2q2k) and a multimer checkpoint in the layout of a run
    fine-tuned on it (`<save>/multimer_model.pt` + the newest iter_N/meta.json) holding out
    2q2k."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("mrel")
    store = d / "complexes.h5"
    build_complex_store(write_manifest(d / "m.tsv", GOOD_ROWS), store)
    save = import_fixture_model(d / "run")
    config = {"data": str(store), "seed": 3, "val_families": "2q2k", "crop_size": 24}
    meta = {"iteration": 1, "config": config, "data_manifest": data_manifest(config)}
    (save / "iter_0000001").mkdir()
    (save / "iter_0000001" / "meta.json").write_text(json.dumps(meta))
    return d, store, save


def _policy(path, **over) -> str:
    path.write_text(yaml.safe_dump({**LAX, **over}))
    return str(path)


def _gate(path) -> str:
    path.write_text(yaml.safe_dump({"accept_mean_plddt": 0.0, "max_very_low_fraction": 1.0,
                                    "min_msa_depth": 1, "review_beyond_training_crop": False,
                                    "min_iptm": 0.0, "max_interface_pae": 1.0e6, "min_ipsae": 0.0}))
    return str(path)


def _predict(ckpt, out, d, *extra) -> tuple[int, list[dict]]:
    fasta = d / "dimer.fasta"
    fasta.write_text(f">dimer\n{DIMER}:{DIMER}\n")
    rc = protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out",
                      str(out), "--gating", _gate(d / "gate.yaml"), "--no-plots",
                      "--no-progress", "--num-recycles", "0", *extra])
    if rc != 0:
        return rc, []
    rows = []
    for tdir in (out / "targets").iterdir():
        rows.append(json.loads((current_prediction(tdir) / "provenance.json").read_text()))
    return rc, rows


def test_interface_lddt_against_an_explicit_loop_and_perturbations(run):
    _, store, _ = run
    with ComplexStore(store) as s:
        x = complex_example(s.read("2q2k"), crop_size=s.length("2q2k"), seed=0)
    true = x["all_atom_positions"][:, CA].astype(float)
    mask = x["all_atom_mask"][:, CA].astype(float)
    asym, entity = x["asym_id"], x["entity_id"]
    rng = np.random.default_rng(0)
    pred = true + rng.normal(0.0, 1.5, true.shape)
    scores, pairs = 0.0, 0                              # reference: lDDT over inter-chain pairs
    for i in range(len(true)):
        for j in range(len(true)):
            if asym[i] == asym[j] or not (mask[i] and mask[j]):
                continue
            d_true = np.linalg.norm(true[i] - true[j])
            if d_true < 15.0:
                diff = abs(d_true - np.linalg.norm(pred[i] - pred[j]))
                scores += np.mean([diff < t for t in (0.5, 1.0, 2.0, 4.0)])
                pairs += 1
    assert pairs > 50
    assert interface_lddt_ca(pred, true, mask, asym) == pytest.approx(scores / pairs, abs=1e-12)
    # chain B moved 40 Å away, each chain intact: the interface is lost, the chains are not
    moved = true.copy()
    moved[asym == 2] += [40.0, 0.0, 0.0]
    s = score_complex(moved, true, mask, asym, entity)
    assert s["interface_lddt"] == 0.0 and 0.5 < s["lddt_ca"] < 1.0
    # the two copies predicted in swapped order: matched back, a perfect score
    swapped = np.concatenate([true[asym == 2], true[asym == 1]])
    s = score_complex(swapped, true, mask, asym, entity)
    assert s["mapped"] and s["lddt_ca"] == pytest.approx(1.0) and \
        s["interface_lddt"] == pytest.approx(1.0)
    assert interface_lddt_ca(true, true, np.where(asym == 1, mask, 0.0), asym) is None


@pytest.fixture(scope="module")
def released(run):
    """`protdp release <run folder>` under LAX: (exit status, stdout, lax policy path)."""
    import contextlib
    import io

    d, _, save = run
    lax = _policy(d / "lax.yaml")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = protdp_main(["release", str(save), "--config", lax])
    return rc, buf.getvalue(), lax


def test_release_of_a_complex_fine_tuned_checkpoint_and_predict_honours_it(run, released,
                                                                          tmp_path, capsys,
                                                                          monkeypatch):
    d, store, save = run
    rc, out, lax = released
    assert rc == 0, out
    assert "interface_accuracy" in out and "protdp release: released" in out
    doc = json.loads((save / "release.json").read_text())
    assert doc["verdict"] == "released" and doc["checkpoint"]["kind"] == MULTIMER_KIND
    assert [c["name"] for c in doc["checks"]] == COMPLEX_CHECKS
    # the run's own validation split of its complex store, recomputed from its config
    assert doc["held_out"] == {"store": str(store), "families": ["2q2k"]}
    per = doc["complexes"]["per_complex"]
    assert [c["complex_id"] for c in per] == ["2q2k"] and per[0]["chains"] == 2
    assert doc["complexes"]["spearman_with_interface_lddt"] == {"iptm": None,    # 1 complex
                                                                "interface_pae": None}
    checks = {c["name"]: c for c in doc["checks"]}
    assert 0 <= per[0]["interface_lddt"] <= 1 and 0 <= per[0]["lddt_ca"] <= 1
    assert checks["interface_accuracy"]["value"] == pytest.approx(per[0]["interface_lddt"])
    assert checks["iptm_calibration"]["value"] == pytest.approx(
        abs(per[0]["iptm"] - per[0]["interface_lddt"]))
    assert checks["held_out_accuracy"]["value"] == pytest.approx(per[0]["lddt_ca"])
    # the training store was screened (every chain), not "not applicable"
    screening = checks["training_data_screening"]
    assert screening["passed"] and screening["value"] == 0 and not screening["detail"]
    red = json.loads((save / "release_redteam" / "redteam_report.json").read_text())
    assert red["kind"] == "complexes" and red["ok"] and checks["redteam"]["value"] == 0
    assert {"control_homodimer", "screening_chain", "nan_producing_overflow_weights"} <= {
        c["name"] for c in red["cases"]}
    sha = doc["checkpoint"]["sha256"]

    # a site as lax except for the complex thresholds: the record's min_interface_lddt 0 and
    # max_iptm_error 1 are weaker than the site's, so no release
    site = ReleasePolicy()
    monkeypatch.setenv("PROTDP_RELEASE_POLICY", _policy(
        tmp_path / "site.yaml", min_interface_lddt=site.min_interface_lddt,
        max_iptm_error=site.max_iptm_error))
    status = read_release(save, sha, floor=weaker_thresholds)
    assert not status.released and status.failed == ["release_policy"]
    assert "min_interface_lddt" in status.reason and "max_iptm_error" in status.reason
    record = (save / "release.json").read_text()          # a record relabelled as a monomer's:
    relabelled = json.loads(record)                        # the served kind decides, not it
    relabelled["checkpoint"]["kind"] = "model-file"
    (save / "release.json").write_text(json.dumps(relabelled))
    assert read_release(save, sha, floor=weaker_thresholds).released
    assert "min_interface_lddt" in read_release(save, sha, floor=weaker_thresholds,
                                                multimer=True).reason
    (save / "release.json").write_text(record)
    capsys.readouterr()
    rc, _ = _predict(save, tmp_path / "site", d)
    assert rc == 2 and "min_interface_lddt" in capsys.readouterr().err
    # the site adopts that policy: the complex is routed by the gate alone, not forced to review
    monkeypatch.setenv("PROTDP_RELEASE_POLICY", lax)
    assert read_release(save, sha, floor=weaker_thresholds).released
    rc, rows = _predict(save, tmp_path / "released", d)
    assert rc == 0 and len(rows) == 1
    assert rows[0]["gate"]["route"] == "accepted" and rows[0]["gate"]["reasons"] == []
    assert rows[0]["config"]["release"]["released"] is True


def test_an_overconfident_multimer_checkpoint_is_refused(run, released, tmp_path, capsys,
                                                         monkeypatch):
    """pLDDT pinned at its top bin whatever the structure: calibration_ece fails (the
    released checkpoint's ECE stays under the same threshold); predict refuses it, and
    --allow-unreleased sends every complex to review."""
    d, store, save = run
    bad = tmp_path / "overconfident"
    bad.mkdir()
    blob = torch.load(save / MULTIMER_MODEL_FILE, weights_only=True)
    head = "plddt_head.linear_3"
    blob["state_dict"][f"{head}.weight"].zero_()
    blob["state_dict"][f"{head}.bias"].fill_(-10.0)
    blob["state_dict"][f"{head}.bias"][-1] = 10.0                  # pLDDT ~ 99 everywhere
    torch.save(blob, bad / MULTIMER_MODEL_FILE)
    strict = _policy(tmp_path / "strict.yaml", max_ece=0.6)
    monkeypatch.setenv("PROTDP_RELEASE_POLICY", strict)
    with pytest.raises(InputError, match="--data"):                # imported: no split recorded
        held_out({}, None, None, open_store=ComplexStore)
    assert protdp_main(["release", str(bad), "--data", str(store), "--families", "2q2k",
                        "--config", strict]) == 1
    doc = json.loads((bad / "release.json").read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert doc["verdict"] == "refused" and not checks["calibration_ece"]["passed"]
    assert checks["calibration_ece"]["value"] > 0.6
    assert doc["complexes"]["per_complex"][0]["mean_plddt"] > 95
    assert "not applicable" in checks["training_data_screening"]["detail"]   # imported weights
    good = json.loads((save / "release.json").read_text())    # the same weights, unpinned
    assert next(c for c in good["checks"] if c["name"] == "calibration_ece")["value"] < 0.6
    status = read_release(bad, doc["checkpoint"]["sha256"], floor=weaker_thresholds)
    assert not status.released and "calibration_ece" in status.failed
    capsys.readouterr()
    rc, _ = _predict(bad, tmp_path / "refused", d)
    err = capsys.readouterr().err
    assert rc == 2 and "not released" in err and "calibration_ece" in err
    rc, rows = _predict(bad, tmp_path / "allowed", d, "--allow-unreleased")
    assert rc == 0 and len(rows) == 1
    assert rows[0]["gate"]["route"] == "needs_review"
    assert rows[0]["gate"]["reasons"] == ["unreleased_checkpoint"]


def test_screening_of_a_complex_store_and_the_site_floor_of_complex_thresholds(run, tmp_path):
    _, store, _ = run
    with ComplexStore(store) as s:
        seq = str(s.read("2q2k")["chains"][1]["sequence"])
        ids = list(s.family_ids)
    listed = tmp_path / "concern.fasta"
    listed.write_text(f">concern\n{seq}\n")
    meta = {"config": {"data": str(store)}}
    hit = screening_check(meta, ReleasePolicy(screening_list=str(listed)))
    assert not hit["passed"] and hit["value"] == 2 and "2q2k/A" in hit["detail"]
    clean = screening_check(meta, ReleasePolicy())
    assert clean["passed"] and clean["value"] == 0
    # the split a training run's config names, recomputed
    from protdp.config import from_dict
    from protdp.train.args import TrainArgs
    cfg = {"data": str(store), "seed": 5, "val_fraction": 0.5}
    want = split_families(ids, from_dict(TrainArgs, cfg, source="test"))[1]
    assert held_out({"config": cfg}, None, None, open_store=ComplexStore) == (store, want)
    # complex thresholds bind a multimer checkpoint's record only
    site = ReleasePolicy().__dict__
    old_monomer = {k: v for k, v in site.items() if k not in ("min_interface_lddt",
                                                              "max_iptm_error")}
    assert weaker_thresholds(old_monomer, complexes=False) == []
    assert sorted(w.split()[0] for w in weaker_thresholds(old_monomer)) == [
        "max_iptm_error", "min_interface_lddt"]
    assert weaker_thresholds({**site, "max_iptm_error": 0.9})[0].startswith("max_iptm_error")
    assert MULTIMER_RECORD_KIND == MULTIMER_KIND


def test_an_iteration_of_a_complex_run_is_one_line_naming_the_run_folder(run, capsys):
    _, _, save = run
    assert protdp_main(["release", str(save / "iter_0000001")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "release the run folder" in err
