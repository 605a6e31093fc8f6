"""Self-distillation from reviewed predictions (issue 21 deliverables 3-4): real predictions go
through the gate into the review queue; reviewers approve, reject or leave them; `protdp review
export --format store` writes only the approved ones as store families (predicted atoms as labels,
the MSA they were predicted from, provenance), the store round-trips through FamilyStore and
verify, and a 2-rank training run on a mixed corpus logs its per-source counts."""

from __future__ import annotations

import json
import subprocess

import gemmi
import numpy as np
import pytest
import torch

from data_fixtures import build_pairs_store
from protdp.cli import main as protdp_main
from protdp.data.parse import merge_msas, parse_msa
from protdp.data.residue_constants import ATOM_ORDER
from protdp.data.store import FamilyStore, verify_store
from protdp.paths import REPO_ROOT
from protdp.train import report
from protdp.train.launch import torchrun_cmd, worker_env
from protdp.train.sources import DISTILLATION, PDB, pick_source
from protdp.inference.layout import current_prediction

CHAINS = {"2p90_A02": "msa/2p90_A02.hhblits_subsample.a3m", "2q2k_A": "msa/2q2k_A.bfd_uniclust.a3m",
          "7a4d_E": "msa/7a4d_E.colabfold.a3m", "5awl_A": "msa/5awl_A.single_seq.a3m"}


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory, data_dir):
    """4 real chains predicted into a queue; alice approves 2p90_A02 and 2q2k_A, rejects 7a4d_E;
    5awl_A stays pending."""
    from protdp.inference.checkpoint import save_model_checkpoint
    from protdp.inference.predictor import PredictConfig
    from protdp.model import build_model
    from protdp.review.store import ReviewStore
    from protdp.workflows import predict

    tmp = tmp_path_factory.mktemp("distill")
    torch.manual_seed(0)
    model = build_model("configs/model/tiny.yaml", verbose=False)
    ckpt = save_model_checkpoint(model, None, tmp / "tiny.pt", training_crop=64)
    msa_dir = tmp / "msa"
    msa_dir.mkdir()
    lines = []
    for name, msa in CHAINS.items():
        (msa_dir / f"{name}.a3m").write_bytes((data_dir / msa).read_bytes())
        lines += [f">{name}", parse_msa(data_dir / msa).query]
    (tmp / "t.fasta").write_text("\n".join(lines) + "\n")
    url = f"sqlite:///{tmp / 'queue.sqlite'}"
    res = predict(ckpt, tmp / "t.fasta", tmp / "pred", msa_dir=msa_dir, queue_url=url,
                  config=PredictConfig(max_msa_rows=16), progress=False, release_gate="review")
    assert all(r["route"] == "needs_review" for r in res.rows)
    store = ReviewStore(url)
    admin_token = store.init_admin()
    alice = store.reviewer(store.admin(admin_token).add_reviewer("alice"))
    by_target = {i["target"]: i["id"] for i in store.list(state=None)}
    for target, action in (("2p90_A02", "approve"), ("2q2k_A", "approve"), ("7a4d_E", "reject")):
        alice.claim(by_target[target])
        alice.decide(by_target[target], action, comment="checked against the experiment")
    store.close()
    with pytest.MonkeyPatch.context() as mp:    # export needs the admin token
        mp.setenv("PROTDP_REVIEW_ADMIN_TOKEN", admin_token)
        yield tmp, url, by_target


def test_export_writes_only_approved_predictions_with_provenance(reviewed, data_dir):
    tmp, url, by_target = reviewed
    out = tmp / "distill.h5"
    assert protdp_main(["review", "export", "--queue-url", url, "--format", "store",
                        "--out", str(out)]) == 0
    assert verify_store(out).ok
    with FamilyStore(out) as store:
        fams = {store.read(f)["distillation"]: store.read(f) for f in store.family_ids}
    fams = {json.loads(k)["target"]: v for k, v in fams.items()}
    assert sorted(fams) == ["2p90_A02", "2q2k_A"]            # rejected and pending never exported
    for target, fam in fams.items():
        prov = json.loads(fam["distillation"])
        assert fam["source_kind"] == "distillation" and prov["reviewer"] == "alice"
        assert prov["item_id"] == by_target[target] and prov["decided_at"]
        assert len(prov["checkpoint"]["sha256"]) == 64
        assert fam["resolution"] == 0.0                       # out of the pLDDT loss's range
        # the MSA the prediction was made from
        msa = merge_msas([parse_msa(data_dir / CHAINS[target])])
        np.testing.assert_array_equal(fam["msa"], msa.tokens())
        np.testing.assert_array_equal(fam["deletion_matrix"], msa.deletion_matrix)
        # the predicted atoms as the label: every atom of the written PDB, via gemmi
        pdb = current_prediction(tmp / "pred" / "targets" / target) / f"{target}.pdb"
        residues = gemmi.read_structure(str(pdb))[0][0]
        n_atoms = 0
        for i, res in enumerate(residues):
            for atom in res:
                slot = ATOM_ORDER[atom.name]
                assert fam["all_atom_mask"][i, slot] == 1
                np.testing.assert_allclose(fam["all_atom_positions"][i, slot],
                                           [atom.pos.x, atom.pos.y, atom.pos.z], atol=1e-3)
                n_atoms += 1
        assert n_atoms == int(fam["all_atom_mask"].sum()) > 4 * len(fam["sequence"])


def test_changed_msa_is_skipped_with_its_reason(reviewed, capsys):
    tmp, url, _ = reviewed
    msa = tmp / "msa" / "2q2k_A.a3m"
    original = msa.read_bytes()
    msa.write_bytes(original + b">extra\n" + b"A" * 70 + b"\n")
    try:
        assert protdp_main(["review", "export", "--queue-url", url, "--format", "store",
                            "--out", str(tmp / "changed.h5")]) == 0
    finally:
        msa.write_bytes(original)
    err = capsys.readouterr().err
    assert "MSA file changed or is gone" in err and "1 skipped" in err
    with FamilyStore(tmp / "changed.h5") as store:
        assert len(store.family_ids) == 1
    assert protdp_main(["review", "export", "--queue-url", url, "--format", "store"]) == 2


def test_structure_edited_after_approval_is_never_exported(reviewed, capsys):
    """Issue 26: the approved PDB doubled in place is refused by name, not exported."""
    tmp, url, by_target = reviewed
    pdb = current_prediction(tmp / "pred" / "targets" / "2q2k_A") / "2q2k_A.pdb"
    original = pdb.read_bytes()
    st = gemmi.read_structure(str(pdb))
    for res in st[0][0]:
        for atom in res:
            atom.pos = gemmi.Position(2 * atom.pos.x, 2 * atom.pos.y, 2 * atom.pos.z)
    st.write_pdb(str(pdb))
    try:
        assert protdp_main(["review", "export", "--queue-url", url, "--format", "store",
                            "--out", str(tmp / "edited.h5")]) == 0
    finally:
        pdb.write_bytes(original)
    err = capsys.readouterr().err
    assert f"skipped item {by_target['2q2k_A']}: pdb: changed since enqueue" in err
    with FamilyStore(tmp / "edited.h5") as store:
        assert len(store.family_ids) == 1


def test_pick_source_draws_the_configured_mix():
    picks = [pick_source(s, 0.75, True) for s in range(4000)]
    assert abs(picks.count(DISTILLATION) / len(picks) - 0.75) < 0.03
    assert {pick_source(s, 0.75, False) for s in range(50)} == {PDB}
    assert {pick_source(s, 1.0, True) for s in range(50)} == {DISTILLATION}


def test_two_rank_training_on_a_mixed_corpus_logs_per_source_counts(reviewed, data_dir, tmp_path):
    tmp, _, _ = reviewed
    distill = tmp / "distill.h5"
    assert distill.is_file()
    pdb = build_pairs_store(data_dir, ("7a4d_E", "2p90_A02", "2q2k_A", "5awl_A"), tmp_path)
    save = tmp_path / "run"
    argv = ["--config", "configs/train/tiny.yaml", "--data", str(pdb), "--distillation-data",
            str(distill), "--distillation-fraction", "0.5", "--train-iters", "4",
            "--global-batch-size", "4", "--lr-warmup-iters", "0", "--save", str(save),
            "--save-interval", "4", "--overlap-grad-reduce", "--use-distributed-optimizer"]
    proc = subprocess.run(torchrun_cmd(argv, nproc=2), env=worker_env(), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train, _ = report.read_metrics(save / "metrics.jsonl")
    assert len(train) == 4
    for rec in train:
        assert rec["samples/pdb"] + rec["samples/distillation"] == rec["samples"] == 4
    totals = {k: sum(r[f"samples/{k}"] for r in train) for k in (PDB, DISTILLATION)}
    assert totals[PDB] > 0 and totals[DISTILLATION] > 0, totals
    state = torch.load(save / "iter_0000004" / "rank_00000.pt", weights_only=True)
    assert "distillation_sampler" in state and "sampler" in state
