"""Interface scores of protdp's own complex predictions (issue 43, item 2): `protdp predict`
with the AlphaFold-Multimer fixture's model writes `interface_scores` (ipsae.py's columns +
actifpTM) into scores.json equal to what `protdp.interface` reads back from the ColabFold
scores JSON and PDB it wrote beside them (the files ipsae.py reads), the best pair's ipSAE and
pDockQ2 into summary.csv, gates on `min_ipsae` (low_ipsae naming the pair) and hands the rows
to the review queue; `protdp complex predict` writes the same rows."""

from __future__ import annotations

import csv
import json

import pytest

from protdp.cli import main as protdp_main
from protdp.data.parse import parse_msa
from protdp.interface.readers import read_prediction
from protdp.interface.scores import ROW_KEYS
from protdp.interface.table import prediction_rows
from protdp.review.store import ReviewStore
from test_complex_pairing import RAW
from test_complex_predict import COMMON, _msa_dir, ckpt  # noqa: F401


def test_predict_writes_gates_and_queues_interface_scores(tmp_path, ckpt, capsys):  # noqa: F811
    qa, qb = parse_msa(RAW / "hbA_1-36.a3m").query, parse_msa(RAW / "hbB_1-40.a3m").query
    fasta = tmp_path / "c.fasta"
    fasta.write_text(f">hb\n{qa}:{qb}\n")
    msas = _msa_dir(tmp_path, {"hb": ("hbA_1-36", "hbB_1-40", False)})
    gating = tmp_path / "gating.yaml"
    gating.write_text("min_ipsae: 1.0\n")           # every pair below: low_ipsae must fire
    out = tmp_path / "out"
    assert protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta),
                        "--msa-dir", str(msas), "--out", str(out), "--gating", str(gating),
                        *COMMON]) == 0, capsys.readouterr().err
    pdir = out / "targets" / "hb" / (out / "targets" / "hb" / "CURRENT").read_text().strip()
    scores = json.loads((pdir / "scores.json").read_text())
    rows = scores["interface_scores"]
    assert [(r["chain_1"], r["chain_2"], r["type"]) for r in rows] == \
        [("A", "B", "asym"), ("B", "A", "asym"), ("A", "B", "max")]
    assert all(set(ROW_KEYS) | {"actifptm"} == set(r) for r in rows)
    assert 0.0 <= rows[0]["actifptm"] <= 1.0 and rows[0]["actifptm"] == rows[2]["actifptm"]
    assert rows[0]["n0chn"] == len(qa) + len(qb) and rows[0]["pae_cutoff"] == 10.0
    # equal to the scores of the files written beside it (ColabFold JSON + PDB: ipsae.py's input)
    cf = next(pdir.glob("hb_scores_rank_001_*.json"))
    again = prediction_rows(read_prediction(cf, pdir / "ranked_0.pdb"), 10.0, 10.0)
    for mine, theirs in zip(rows, again):
        for k in ROW_KEYS:
            assert mine[k] == pytest.approx(theirs[k], abs=1e-6), k
    # protdp's own scores.json + PDB read back by `protdp interface` (PAE there: 1 decimal)
    own = prediction_rows(read_prediction(pdir / "scores.json", pdir / "ranked_0.pdb"), 10, 10)
    assert [r["n0chn"] for r in own] == [r["n0chn"] for r in rows]
    assert own[2]["ipsae"] == pytest.approx(rows[2]["ipsae"], abs=0.02)
    # the gate: low_ipsae names the pair; summary.csv: the best pair's ipSAE and pDockQ2
    assert "low_ipsae" in scores["reasons"]
    assert scores["details"]["low_ipsae"].startswith("chains A-B ipSAE ")
    best = scores["best_interface"]
    assert (best["chain_1"], best["chain_2"], best["ipsae"]) == ("A", "B", rows[2]["ipsae"])
    with open(out / "summary.csv") as fh:
        line = next(r for r in csv.DictReader(fh) if r["id"] == "hb")
    assert line["ipsae"] == f"A-B:{rows[2]['ipsae']:.6f}"
    assert float(line["pdockq2"]) == pytest.approx(rows[2]["pdockq2"], abs=1e-4)
    store = ReviewStore(str(out / "review_queue.sqlite"))
    item = store.list()[0]
    assert item["scores"]["interface_scores"] == rows
    store.close()

    # the complex path (features -> complex predict) writes the same rows
    assert protdp_main(["complex", "features", "--fasta", str(fasta), "--msa-dir", str(msas),
                        "--out", str(tmp_path / "feats")]) == 0
    assert protdp_main(["complex", "predict", "--features-dir", str(tmp_path / "feats"),
                        "--checkpoint", str(ckpt), "--out", str(tmp_path / "ref"),
                        "--num-recycles", "0", "--gating", str(gating),
                        "--allow-unreleased"]) == 0
    tdir = tmp_path / "ref" / "targets" / "hb"        # `protdp predict`'s layout (issue 41)
    ref = json.loads((tdir / (tdir / "CURRENT").read_text().strip() / "scores.json").read_text())
    assert ref["interface_scores"] == rows and "low_ipsae" in ref["reasons"]
