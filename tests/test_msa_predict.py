"""FASTA in, structures out: `protdp predict --db` searches MSAs for targets that have none and
records the database, its sha256 and the search settings in provenance.json.

A tiny randomly initialised checkpoint (as tests/test_predict.py makes one) predicts real
chains; the database is real family members plus shuffled decoys (tests/msa_fixtures.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from msa_fixtures import FAMILIES, family_records, msa_sequences, write_fasta
from protdp.cli import main as protdp_main
from protdp.data.parse import parse_msa
from protdp.gating import load_gate_policy
from protdp.inference.checkpoint import save_model_checkpoint
from protdp.model import build_model
from protdp.msa import SearchSettings
from protdp.paths import REPO_ROOT
from protdp.inference.layout import current_prediction

TINY = REPO_ROOT / "configs" / "model" / "tiny.yaml"
MIN_DEPTH = load_gate_policy().min_msa_depth


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(TINY, verbose=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return save_model_checkpoint(model, None, tmp_path_factory.mktemp("ckpt") / "tiny.pt",
                                 training_crop=32, max_msa_rows=16)


@pytest.fixture(scope="module")
def seqdb(tmp_path_factory, data_dir):
    families = {k: FAMILIES[k] for k in ("2p90_A02", "T1055", "102m_A", "1a00_A")}
    path = tmp_path_factory.mktemp("seqdb") / "uniref_mini.fasta.gz"
    return write_fasta(path, family_records(data_dir, families, background=False))


def _predict(args, capsys):
    rc = protdp_main(["predict", "--allow-unreleased", *map(str, args)])
    return rc, capsys.readouterr()


def test_fasta_without_msas_goes_through_predict_db(tmp_path, ckpt, seqdb, data_dir, capsys):
    t1055 = msa_sequences(data_dir / FAMILIES["T1055"])[0]
    p2p90 = msa_sequences(data_dir / FAMILIES["2p90_A02"])[0]
    fasta = tmp_path / "targets.fasta"
    fasta.write_text(f">T1055 CASP14 target\n{t1055}\n>2p90_A02\n{p2p90}\n")
    out = tmp_path / "preds"
    args = ["--checkpoint", ckpt, "--fasta", fasta, "--out", out, "--db", seqdb,
            "--no-progress", "--device", "cpu", "--max-msa-rows", "16", "--max-length", "200",
            "--search-workers", "1"]
    rc, cap = _predict(args, capsys)
    assert rc == 0, cap.err
    assert "2 targets" in cap.out
    db_sha = hashlib.sha256(Path(seqdb).read_bytes()).hexdigest()
    for name, seq in (("T1055", t1055), ("2p90_A02", p2p90)):
        tdir = current_prediction(out / "targets" / name)
        prov = json.loads((tdir / "provenance.json").read_text())
        scores = json.loads((tdir / "scores.json").read_text())
        search = prov["config"]["msa_search"]
        assert search["databases"] == [{"name": "uniref_mini", "path": str(Path(seqdb).resolve()),
                                        "sha256": db_sha, "size": Path(seqdb).stat().st_size}]
        assert search["settings"] == json.loads(json.dumps(SearchSettings().__dict__))
        assert search["settings"]["evalue"] == 1e-4 and search["settings"]["iterations"] == 1
        # the MSA the model saw is the searched one: real family members, no decoy
        [msa_file] = prov["inputs"]["msa_files"]
        a3m = out / "msa_search" / name / "uniref_mini.a3m"
        assert msa_file["sha256"] == hashlib.sha256(a3m.read_bytes()).hexdigest()
        msa = parse_msa(a3m)
        assert msa.query == seq and msa.depth == scores["msa_depth"] > 10
        assert all(n.startswith("fam|") for n in msa.names[1:])
        assert ("shallow_msa" in scores["reasons"]) == (msa.depth < MIN_DEPTH)
        if name == "2p90_A02":                    # single-sequence mode would be shallow
            assert msa.depth > MIN_DEPTH and "shallow_msa" not in scores["reasons"]
        assert (tdir / f"{name}.pdb").is_file()

    # a re-run finds both the searches and the predictions complete
    rc, cap = _predict(args, capsys)
    assert rc == 0 and "(2 already complete, skipped)" in cap.out


def test_user_msas_win_and_only_the_rest_is_searched(tmp_path, ckpt, seqdb, data_dir, capsys):
    """A target with an MSA in --msa-dir keeps it (not searched); the other is searched."""
    t1055 = msa_sequences(data_dir / FAMILIES["T1055"])[0]
    myo = parse_msa(data_dir / "msa" / "102m_A.colabfold.a3m").query
    fasta = tmp_path / "t.fasta"
    fasta.write_text(f">T1055\n{t1055}\n>myo\n{myo}\n")
    msa_dir = tmp_path / "mine"
    msa_dir.mkdir()
    (msa_dir / "myo.a3m").write_bytes((data_dir / "msa" / "102m_A.colabfold.a3m").read_bytes())
    out = tmp_path / "preds"
    rc, cap = _predict(["--checkpoint", ckpt, "--fasta", fasta, "--out", out, "--db", seqdb,
                        "--msa-dir", msa_dir, "--no-progress", "--device", "cpu",
                        "--max-msa-rows", "16", "--max-length", "200", "--search-workers", "1"],
                       capsys)
    assert rc == 0, cap.err
    assert not (out / "msa_search" / "myo").exists()
    assert (out / "msa_search" / "T1055" / "uniref_mini.a3m").is_file()
    prov = json.loads((current_prediction(out / "targets" / "myo") / "provenance.json").read_text())
    [f] = prov["inputs"]["msa_files"]
    assert f["sha256"] == hashlib.sha256((msa_dir / "myo.a3m").read_bytes()).hexdigest()
    assert Path(f["path"]).resolve() == (msa_dir / "myo.a3m").resolve()


def test_predict_db_errors_are_one_line(tmp_path, ckpt, capsys):
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">a\nMKVLA\n")
    bad = tmp_path / "bad.fasta"
    bad.write_bytes(b">x\nAC1\n")
    for db, expect in ((tmp_path / "missing.fa", "not found"), (bad, "illegal character")):
        rc, cap = _predict(["--checkpoint", ckpt, "--fasta", fasta, "--out", tmp_path / "o",
                            "--db", db, "--no-progress", "--device", "cpu"], capsys)
        assert rc == 2 and expect in cap.err and "Traceback" not in cap.err
        assert len(cap.err.strip().splitlines()) == 1
