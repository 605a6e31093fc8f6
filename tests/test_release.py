"""Release gate (protdp.safety.release, protdp.gating.release): `protdp release` on real
held-out families writes a record whose verdict follows the thresholds; the record counts only
for the exact weights it was made for; the screening check finds a listed training family; a
training run launches the check after its save and waits for the last one."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
import yaml
from data_fixtures import build_pairs_store

from protdp.cli import main as protdp_main
from protdp.gating.release import ReleasePolicy
from protdp.paths import REPO_ROOT
from protdp.safety.release import screening_check
from protdp.train.launch import torchrun_cmd, worker_env
from protdp.train.release_record import read_release
from protdp.inference.layout import current_prediction

PAIRS = ("7a4d_E", "2p90_A02", "2q2k_A", "5awl_A")
LAX = {"min_spearman_residue": -1.0, "min_mean_lddt_ca": 0.0, "max_ece": 1.0,
       "band_tolerance": 1000.0, "max_redteam_failures": 1000, "min_targets": 1}


@pytest.fixture(scope="module")
def store(tmp_path_factory, data_dir):
    return build_pairs_store(data_dir, PAIRS, tmp_path_factory.mktemp("release_store"))


@pytest.fixture()
def ckpt(tmp_path):
    from protdp.inference.checkpoint import save_model_checkpoint
    from protdp.model import build_model
    torch.manual_seed(0)
    model = build_model("configs/model/tiny.yaml", verbose=False)
    with torch.no_grad():   # the zero-initialised head predicts a constant pLDDT: no ranking
        model.plddt_head.linear_3.weight.normal_(0.0, 2.0)
        model.plddt_head.linear_3.bias.normal_(0.0, 2.0)
    return save_model_checkpoint(model, model.config, tmp_path / "m" / "tiny.pt", training_crop=64)


def _policy(tmp_path, **over) -> str:
    path = tmp_path / "release.yaml"
    path.write_text(yaml.safe_dump(over))
    return str(path)


def _release(ckpt, store, policy_path) -> tuple[int, dict]:
    rc = protdp_main(["release", str(ckpt), "--data", str(store), "--families", ",".join(PAIRS),
                      "--config", policy_path])
    return rc, json.loads((ckpt.parent / "release.json").read_text())


def _redteam_once(monkeypatch) -> None:
    """Run the red-team suite for real once per checkpoint in this test; later releases of the
    same weights under other thresholds reuse its result (the suite's own tests:
    test_redteam.py)."""
    import protdp.safety.release as release
    real, results = release.run_suite, {}

    def once(checkpoint, *args, **kwargs):
        key = str(checkpoint)
        if key not in results:
            results[key] = real(checkpoint, *args, **kwargs)
        return results[key]
    monkeypatch.setattr(release, "run_suite", once)


def test_verdict_follows_the_thresholds_and_binds_to_the_weights(ckpt, store, tmp_path, capsys,
                                                                 monkeypatch):
    from protdp.inference.checkpoint import load_model_checkpoint
    sha = load_model_checkpoint(ckpt).sha256
    _redteam_once(monkeypatch)

    rc, doc = _release(ckpt, store, _policy(tmp_path, **LAX))
    assert rc == 0 and doc["verdict"] == "released" and doc["checkpoint"]["sha256"] == sha
    names = [c["name"] for c in doc["checks"]]
    assert names == ["held_out_accuracy", "calibration_spearman", "calibration_ece",
                     "calibration_band_accuracy", "redteam", "training_data_screening"]
    assert doc["calibration"]["n_targets"] == len(PAIRS) and 0 <= doc["calibration"]["ece"] <= 1
    screening = doc["checks"][-1]
    assert screening["passed"] and "not applicable" in screening["detail"]   # a model file
    assert read_release(ckpt.parent, sha).released

    # a stricter Spearman threshold than any model can meet: refused, exit 1, the check named
    rc, doc = _release(ckpt, store, _policy(tmp_path, **{**LAX, "min_spearman_residue": 1.0}))
    assert rc == 1 and doc["verdict"] == "refused"
    status = read_release(ckpt.parent, sha)
    assert not status.released and status.failed == ["calibration_spearman"]
    assert "calibration_spearman" in capsys.readouterr().out

    # an untrained model, whatever its calibration, is not accurate enough to serve
    rc, doc = _release(ckpt, store, _policy(tmp_path, **{**LAX, "min_mean_lddt_ca": 0.5}))
    accuracy = doc["checks"][0]
    assert rc == 1 and accuracy["name"] == "held_out_accuracy" and not accuracy["passed"]
    assert 0 <= accuracy["value"] < 0.5 and read_release(ckpt.parent, sha).failed == [
        "held_out_accuracy"]

    # too few held-out families: no evidence, no release
    rc, doc = _release(ckpt, store, _policy(tmp_path, **{**LAX, "min_targets": 10}))
    assert rc == 1 and {c["name"] for c in doc["checks"] if not c["passed"]} == {
        "held_out_accuracy", "calibration_spearman", "calibration_ece",
        "calibration_band_accuracy"}


def test_record_counts_only_for_its_own_weights(ckpt, store, tmp_path):
    rc, doc = _release(ckpt, store, _policy(tmp_path, **LAX))
    assert rc == 0
    assert not read_release(ckpt.parent, "0" * 64).released                # other weights
    doc["checks"][0]["passed"] = False                                      # edited record
    (ckpt.parent / "release.json").write_text(json.dumps(doc))
    assert not read_release(ckpt.parent, doc["checkpoint"]["sha256"]).released
    (ckpt.parent / "release.json").write_text("{not json")
    assert "unreadable" in read_release(ckpt.parent, doc["checkpoint"]["sha256"]).reason
    (ckpt.parent / "release.json").unlink()
    assert "no release record" in read_release(ckpt.parent, "x").reason


def test_screening_check_finds_a_listed_training_family(store, tmp_path):
    from protdp.data.store import FamilyStore
    with FamilyStore(store) as s:
        seq = s.read("2q2k_A")["sequence"]
    listed = tmp_path / "concern.fasta"
    listed.write_text(f">concern\n{seq}\n")
    check = screening_check({"config": {"data": str(store)}},
                            ReleasePolicy(screening_list=str(listed)))
    assert not check["passed"] and check["value"] == 1 and "2q2k_A" in check["detail"]
    clean = screening_check({"config": {"data": str(store)}}, ReleasePolicy())
    assert clean["passed"] and clean["value"] == 0


def test_screening_finds_moved_training_data_by_content_and_fails_when_unresolvable(
        store, tmp_path, data_dir):
    """Issue 26: the recorded store moved away; the check finds it by sha256 under --data and
    screens it; a store nowhere to be found is a failed check, never 'not applicable'."""
    import shutil

    from protdp.data.store import FamilyStore
    from protdp.train.checkpointing import data_manifest
    with FamilyStore(store) as s:
        seq = s.read("2q2k_A")["sequence"]
    listed = tmp_path / "concern.fasta"
    listed.write_text(f">concern\n{seq}\n")
    policy = ReleasePolicy(screening_list=str(listed))
    recorded = tmp_path / "train.h5"
    shutil.copy(store, recorded)
    meta = {"config": {"data": str(recorded)}}
    meta["data_manifest"] = data_manifest(meta["config"])
    moved = tmp_path / "elsewhere.h5"
    recorded.rename(moved)
    lost = screening_check(meta, policy)
    assert not lost["passed"] and "not found" in lost["detail"] and str(recorded) in lost["detail"]
    found = screening_check(meta, policy, [moved])
    assert not found["passed"] and found["value"] == 1 and "2q2k_A" in found["detail"]
    # another file under the recorded name is not the training data
    (tmp_path / "other").mkdir()
    shutil.copy(build_pairs_store(data_dir, ("7a4d_E",), tmp_path / "other"), recorded)
    assert not screening_check(meta, policy)["passed"]
    assert "not found" in screening_check(meta, policy)["detail"]


def test_weaker_record_policy_is_named_against_the_site_policy(tmp_path, monkeypatch):
    from protdp.gating.release import site_policy, weaker_thresholds
    site = site_policy().__dict__
    assert weaker_thresholds(dict(site)) == []
    lax = {**site, "min_mean_lddt_ca": 0.0, "max_ece": 1.0, "min_spearman_residue": -1.0,
           "min_targets": 0}
    named = weaker_thresholds(lax)
    assert sorted(n.split()[0] for n in named) == ["max_ece", "min_mean_lddt_ca",
                                                    "min_spearman_residue", "min_targets"]
    stricter = {**site, "min_mean_lddt_ca": 0.9, "max_ece": 0.01}
    assert weaker_thresholds(stricter) == []
    assert len(weaker_thresholds(None)) >= 7                  # no policy recorded: all weaker
    site_file = tmp_path / "site.yaml"
    site_file.write_text(yaml.safe_dump(lax))
    monkeypatch.setenv("PROTDP_RELEASE_POLICY", str(site_file))   # an admin lowers the floor
    assert weaker_thresholds(lax) == []


def test_training_run_launches_the_check_after_its_save(store, tmp_path):
    save = tmp_path / "run"
    argv = ["--config", "configs/train/tiny.yaml", "--data", str(store), "--train-iters", "2",
            "--save", str(save), "--save-interval", "2", "--release-check", "--lr-warmup-iters",
            "0", "--val-fraction", "0.5"]
    proc = subprocess.run(torchrun_cmd(argv, nproc=1), env=worker_env(), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "release check of" in proc.stdout
    it = save / "iter_0000002"
    doc = json.loads((it / "release.json").read_text())
    assert doc["held_out"]["store"] == str(store) and len(doc["held_out"]["families"]) == 2
    assert {c["name"] for c in doc["checks"]} >= {"calibration_spearman", "redteam",
                                                  "training_data_screening"}
    screening = next(c for c in doc["checks"] if c["name"] == "training_data_screening")
    assert screening["value"] == 0 and screening["passed"]      # the run's store was screened
    assert (it / "release.log").stat().st_size > 0
    # the trainer reports the record's verdict for these exact weights
    from protdp.train.checkpointing import checkpoint_digest
    assert doc["checkpoint"]["sha256"] == checkpoint_digest(it)
    failed = [c["name"] for c in doc["checks"] if not c["passed"]]
    expected = ("released" if doc["verdict"] == "released" and not failed
                else "not released: failed release checks: " + ", ".join(failed or ["verdict"]))
    assert f"release check of {it}: {expected}\n" in proc.stdout


def _permissive_gate(tmp_path) -> str:
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump({"accept_mean_plddt": 0.0, "max_very_low_fraction": 1.0,
                                    "min_msa_depth": 1, "review_beyond_training_crop": False}))
    return str(path)


def test_predict_refuses_unreleased_and_allow_unreleased_sends_all_to_review(ckpt, store,
                                                                             tmp_path, capsys,
                                                                             monkeypatch):
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">t1\nMKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ\n>t2\nGSHMSDKIIHLTDDSFDTDVLKA\n")
    base = ["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--no-progress",
            "--gating", _permissive_gate(tmp_path)]

    # a failed check: refused with one line naming it, nothing predicted
    rc, _ = _release(ckpt, store, _policy(tmp_path, **{**LAX, "min_spearman_residue": 1.0}))
    assert rc == 1
    capsys.readouterr()
    assert protdp_main([*base, "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not released" in err and "calibration_spearman" in err
    assert not (tmp_path / "refused" / "summary.tsv").exists()

    # --allow-unreleased: runs, every prediction to review, recorded
    assert protdp_main([*base, "--out", str(tmp_path / "allowed"), "--allow-unreleased"]) == 0
    for tdir in map(current_prediction, (tmp_path / "allowed" / "targets").iterdir()):
        prov = json.loads((tdir / "provenance.json").read_text())
        assert prov["gate"]["route"] == "needs_review"
        assert prov["gate"]["reasons"] == ["unreleased_checkpoint"]
        rel = prov["config"]["release"]
        assert rel["gate"] == "review" and rel["released"] is False
        assert rel["failed"] == ["calibration_spearman"]

    # released: the same targets pass the (permissive) gate, and the record is in provenance
    lax = _policy(tmp_path, **LAX)
    rc, _ = _release(ckpt, store, lax)
    assert rc == 0
    # issue 26: released under a laxer policy than the site's (the packaged one) = unreleased,
    # naming the weaker thresholds
    capsys.readouterr()
    assert protdp_main([*base, "--out", str(tmp_path / "lax")]) == 2
    err = capsys.readouterr().err
    assert "weaker than this site's" in err and "min_mean_lddt_ca" in err
    # ... until the site's administrator sets that policy as the site's
    monkeypatch.setenv("PROTDP_RELEASE_POLICY", lax)
    assert protdp_main([*base, "--out", str(tmp_path / "released")]) == 0
    for tdir in map(current_prediction, (tmp_path / "released" / "targets").iterdir()):
        prov = json.loads((tdir / "provenance.json").read_text())
        assert prov["gate"]["route"] == "accepted"
        assert prov["config"]["release"]["released"] is True


@pytest.mark.parametrize("field, value", [
    ("min_mean_lddt_ca", "abc"), ("min_mean_lddt_ca", 2), ("min_mean_lddt_ca", float("nan")),
    ("max_ece", [1]), ("min_spearman_residue", True), ("band_tolerance", -3)])
def test_a_bad_threshold_is_one_line_naming_it(tmp_path, capsys, field, value):
    with pytest.raises(ValueError, match=f"{field} must be a number in"):
        ReleasePolicy(**{field: value})
    rc = protdp_main(["release", str(tmp_path), "--config", _policy(tmp_path, **{field: value})])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and f"{field} must be a number" in err


def test_a_bad_family_list_is_one_line_naming_it(tmp_path, capsys):
    """`--families @FILE` of release / calibrate: binary data was a UnicodeDecodeError
    traceback; a folder, a missing or an empty list is one line naming the file."""
    (tmp_path / "bin.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00\xf0\x9f")
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    (tmp_path / "dir.txt").mkdir()
    (tmp_path / "ok.txt").write_text("2p90_A02\n# held out\n 5awl_A \n")
    from protdp.safety.cli import _families_arg
    assert _families_arg(f"@{tmp_path / 'ok.txt'}") == ["2p90_A02", "5awl_A"]
    for name, why in (("bin.txt", "bin.txt:1: not a text file: NUL byte at offset 7"),
                      ("empty.txt", "empty.txt: family list names no family"),
                      ("dir.txt", "dir.txt: a directory"),
                      ("nope.txt", "nope.txt: file not found")):
        for cmd in (["release", str(tmp_path)],
                    ["calibrate", "--checkpoint", str(tmp_path), "--data", str(tmp_path / "s.h5")]):
            rc = protdp_main(cmd + ["--families", f"@{tmp_path / name}"])
            err = capsys.readouterr().err.strip().splitlines()
            assert rc == 2 and len(err) == 1 and why in err[0], (cmd, err)
