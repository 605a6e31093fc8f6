"""Complexes through `protdp predict` (issue 32): a multimer checkpoint (`protdp weights import`
of the AlphaFold-Multimer fixture's params) predicts ColabFold 'A:B' records into the monomer
path's layout (CURRENT, ranked_K, ranking_debug.json by 0.8 ipTM + 0.2 pTM, the PAE JSON with
chain ranges, ColabFold scores, summary.csv with ipTM, the gate with ipTM / interface PAE, the
review queue with the chains). Reference: `protdp complex features` + `protdp complex predict`
(precomputed features through the same path) on the same inputs and seed give the same scores.
Hostile complexes (300 chains, a chain of length 0, a malformed species header, a homomer of
1) and a checkpoint of the other kind are one line each and the batch goes on."""

from __future__ import annotations

import csv
import json
import re

import gemmi
import numpy as np
import pytest
import torch

from protdp.cli import main as protdp_main
from protdp.data.parse import parse_msa
from protdp.inference.checkpoint import MULTIMER_MODEL_FILE
from protdp.inference.writers import read_summary
from protdp.review.store import ReviewStore
from protdp.weights import multimer_checkpoint
from test_complex_pairing import FIXTURE, RAW
from test_predict_batch import RELAX_TIMEOUT_S, assert_relax_timing

PARAMS = FIXTURE / "params" / "params_model_1_multimer_v3_small.npz"
CONFIG = FIXTURE / "config_model_1_multimer_v3_small.json"
COMMON = ["--num-recycles", "0", "--no-plots", "--no-progress", "--allow-unreleased"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("mm") / "mm1"
    assert protdp_main(["weights", "import", "--format", "alphafold", str(PARAMS), "--out",
                        str(out), "--alphafold-config", str(CONFIG)]) == 0
    return out


def _msa_dir(tmp_path, complexes: dict[str, tuple[str, str, bool]]):
    """`protdp msa search --complexes` layout from the fixture's raw per-chain inputs:
    <complex>_<chain>/uniref90.a3m and (heteromers) stockholm/uniprot.sto."""
    root = tmp_path / "msas"
    for name, (a, b, malformed) in complexes.items():
        for cid, chain in (("A", a), ("B", b)) if a != b else (("A", a),):
            d = root / f"{name}_{cid}"
            (d / "stockholm").mkdir(parents=True)
            (d / "uniref90.a3m").write_bytes((RAW / f"{chain}.a3m").read_bytes())
            sto = RAW / f"{chain}.uniprot_hits.sto"
            if sto.is_file():
                text = sto.read_text()
                if malformed:           # one UniProt-style name without its _SPECIES suffix
                    first = re.search(r"^((?:tr|sp)\|\w+\|\w+)_[A-Z0-9]+", text, re.M).group(1)
                    text = re.sub(re.escape(first) + r"_[A-Z0-9]+", first, text)
                (d / "stockholm" / "uniprot.sto").write_text(text)
    return root


def test_complexes_through_protdp_predict(tmp_path, ckpt, capsys):
    qa, qb = parse_msa(RAW / "hbA_1-36.a3m").query, parse_msa(RAW / "hbB_1-40.a3m").query
    q2 = parse_msa(RAW / "2p90_A02.a3m").query
    fasta = tmp_path / "complexes.fasta"
    fasta.write_text(f">hb\n{qa}:{qb}\n>homo\n{q2}:{q2}\n>badsp\n{qa}:{qb}\n"
                     f">zero\n{qa}::{qb}\n>one\n{qa}\n>many\n{':'.join(['GS'] * 300)}\n")
    msas = _msa_dir(tmp_path, {"hb": ("hbA_1-36", "hbB_1-40", False),
                               "homo": ("2p90_A02", "2p90_A02", False),
                               "badsp": ("hbA_1-36", "hbB_1-40", True)})
    out = tmp_path / "out"
    rc = protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta),
                      "--msa-dir", str(msas), "--out", str(out), *COMMON,
                      "--relax", "--relax-timeout", str(RELAX_TIMEOUT_S)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "6 targets: 0 accepted, 3 need review, 3 rejected" in cap.out, cap.out
    rows = {r["target"]: r for r in read_summary(out / "summary.tsv")}
    assert [rows[n]["status"] for n in ("hb", "homo", "badsp")] == ["predicted"] * 3
    # hostile complexes: one line each, naming the file and line and what is wrong
    assert rows["zero"]["route"] == rows["one"]["route"] == rows["many"]["route"] == "rejected"
    assert f"{fasta}:7: chain 2 (B) of complex 'zero' is empty" in rows["zero"]["detail"]
    assert "complex 'one' has a single chain" in rows["one"]["detail"]
    assert "complex 'many' has 300 chains; at most 62" in rows["many"]["detail"]
    assert "without a readable species" in rows["badsp"]["detail"]
    assert "without a readable species" not in rows["hb"]["detail"]

    # the monomer path's layout, every chain in the structures
    pdir = out / "targets" / "hb" / (out / "targets" / "hb" / "CURRENT").read_text().strip()
    scores = json.loads((pdir / "scores.json").read_text())
    assert [(c["chain_id"], c["start"], c["end"]) for c in scores["chains"]] == \
        [("A", 0, len(qa)), ("B", len(qa), len(qa) + len(qb))]
    for f in ("hb.pdb", "ranked_0.pdb", "unrelaxed_model_1_seed_000.pdb"):
        atoms = [ln for ln in (pdir / f).read_text().splitlines() if ln.startswith("ATOM")]
        assert {ln[21] for ln in atoms} == {"A", "B"}, f
    cif = gemmi.cif.read(str(pdir / "hb.cif")).sole_block()     # ModelCIF, every chain
    assert list(cif.find_values("_struct_asym.id")) == ["A", "B"]
    names = list(cif.find_values("_ma_qa_metric.name"))
    values = dict(zip(cif.find_values("_ma_qa_metric_global.metric_id"),
                      cif.find_values("_ma_qa_metric_global.metric_value")))
    iptm_id = list(cif.find_values("_ma_qa_metric.id"))[names.index("ipTM")]
    assert float(values[iptm_id]) == pytest.approx(scores["iptm"], abs=1e-4)
    debug = json.loads((pdir / "ranking_debug.json").read_text())
    # --relax: AlphaFold's relax_<model> entry in timings.json, as for a monomer
    assert_relax_timing(pdir, json.loads((pdir / "timings.json").read_text()),
                        [scores["top_model"]])
    conf = 0.8 * scores["iptm"] + 0.2 * scores["ptm"]
    assert abs(debug["iptm+ptm"]["model_1_seed_000"] - conf) < 0.006
    assert abs(scores["ranking_confidence"] - conf) < 1e-3
    pae_doc = json.loads((pdir / "AF-hb-F1-predicted_aligned_error_v4.json").read_text())[0]
    assert pae_doc["chains"] == scores["chains"]
    assert np.array(pae_doc["predicted_aligned_error"]).shape == (len(qa) + len(qb),) * 2
    cf = json.loads((pdir / "hb_scores_rank_001_alphafold2_multimer_v3_model_1_seed_000.json")
                    .read_text())
    assert cf["iptm"] == round(scores["iptm"], 4)
    assert set(scores["chain_pair_iptm"]) == {"A", "B"}
    # the gate read ipTM / interface PAE (random weights: an unconfident interface)
    assert "low_iptm" in scores["reasons"] and scores["route"] == "needs_review"
    with open(out / "summary.csv") as fh:
        csv_rows = {r["id"]: r for r in csv.DictReader(fh)}
    assert float(csv_rows["hb"]["iptm"]) == pytest.approx(scores["iptm"], abs=1e-4)
    assert csv_rows["hb"]["chain_pair_iptm"].startswith("A-B:")
    homo = json.loads((out / "targets" / "homo" / (out / "targets" / "homo" / "CURRENT")
                       .read_text().strip() / "scores.json").read_text())
    assert [c["chain_id"] for c in homo["chains"]] == ["A", "B"]

    # the review queue holds the complex with its chains and interface scores
    store = ReviewStore(str(out / "review_queue.sqlite"))
    items = {i["target"]: i for i in store.list()}
    assert set(items) == {"hb", "homo", "badsp"}
    assert items["hb"]["scores"]["chains"] == scores["chains"]
    assert items["hb"]["scores"]["iptm"] == scores["iptm"]
    store.close()

    # reference: the precomputed features of the same inputs (complex features -> complex
    # predict, a front end of this same path) give the same scores
    assert protdp_main(["complex", "features", "--fasta", str(fasta), "--msa-dir", str(msas),
                        "--out", str(tmp_path / "feats")]) == 0
    assert protdp_main(["complex", "predict", "--features-dir", str(tmp_path / "feats"),
                        "--checkpoint", str(ckpt), "--out", str(tmp_path / "ref"),
                        *COMMON]) == 0
    capsys.readouterr()
    ref_dir = tmp_path / "ref" / "targets" / "hb"
    ref = json.loads((ref_dir / (ref_dir / "CURRENT").read_text().strip() / "scores.json")
                     .read_text())
    assert ref["iptm"] == scores["iptm"] and ref["ptm"] == scores["ptm"]
    assert ref["plddt"] == scores["plddt"] and ref["chains"] == scores["chains"]

    # a rerun finds every prediction complete
    assert protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta),
                        "--msa-dir", str(msas), "--out", str(out), *COMMON, "--relax",
                        "--relax-timeout", str(RELAX_TIMEOUT_S)]) == 0
    assert "(3 already complete, skipped)" in capsys.readouterr().out


def test_checkpoint_of_the_other_kind_is_one_line(tmp_path, ckpt, capsys):
    """A monomer checkpoint given a complex, a multimer checkpoint given a single chain."""
    from test_predict import tiny_model

    from protdp.inference.checkpoint import save_model_checkpoint

    mono = save_model_checkpoint(tiny_model(), None, tmp_path / "tiny.pt")
    fasta = tmp_path / "mixed.fasta"
    fasta.write_text(">dimer\nMKTAYIAKQR:GSHMLEDPVA\n>single\nMKTAYIAKQRQISF\n")
    rc = protdp_main(["predict", "--checkpoint", str(mono), "--fasta", str(fasta), "--out",
                      str(tmp_path / "o1"), "--msa-mode", "single_sequence", *COMMON])
    assert rc == 0
    rows = {r["target"]: r for r in read_summary(tmp_path / "o1" / "summary.tsv")}
    assert rows["single"]["status"] == "predicted"
    assert rows["dimer"]["route"] == "rejected"
    assert "target 'dimer' is a complex (ColabFold 'A:B' record): predict it with a multimer " \
           "checkpoint" in rows["dimer"]["detail"]
    rc = protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out",
                      str(tmp_path / "o2"), *COMMON])
    assert rc == 0
    rows = {r["target"]: r for r in read_summary(tmp_path / "o2" / "summary.tsv")}
    assert rows["dimer"]["status"] == "predicted"       # single-sequence complex (no --msa-dir)
    assert "shallow_msa" in rows["dimer"]["reasons"]
    assert rows["single"]["route"] == "rejected"
    assert "complex 'single' has a single chain" in rows["single"]["detail"]
    capsys.readouterr()
    # an ensemble mixing the two kinds is one line before any work
    rc = protdp_main(["predict", "--checkpoint", str(ckpt), "--checkpoint", str(mono),
                      "--fasta", str(fasta), "--out", str(tmp_path / "o3"), *COMMON])
    assert rc != 0 and "mixes monomer and multimer checkpoints" in capsys.readouterr().err


def test_multimer_file_name_is_the_weights_one():
    assert MULTIMER_MODEL_FILE == multimer_checkpoint.MULTIMER_MODEL_FILE


def test_predict_searches_and_pairs_complex_msas_with_db(tmp_path, ckpt, capsys):
    """--db: every distinct chain searched as `msa search --complexes` does (the UniProt
    Stockholm alignment kept for the pairing), then paired and predicted; provenance names
    the databases. Database: the fixture's UniProt rows of both chains."""
    from test_complex_search import _records

    qa, qb = parse_msa(RAW / "hbA_1-36.a3m").query, parse_msa(RAW / "hbB_1-40.a3m").query
    db = tmp_path / "uniprot.fasta"
    db.write_text("".join(f">{n}\n{q}\n" for n, q in _records("hbA_1-36") + _records("hbB_1-40")))
    uniref = tmp_path / "uniref90.fasta"                  # the unpaired MSAs' database
    uniref.write_text(db.read_text())
    fasta = tmp_path / "hb.fasta"
    fasta.write_text(f">hb\n{qa}:{qb}\n")
    out = tmp_path / "out"
    rc = protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out",
                      str(out), "--db", str(db), "--db", str(uniref), "--search-iterations", "1",
                      "--search-workers", "1", *COMMON])
    assert rc == 0, capsys.readouterr().err
    assert sorted(p.name for p in (out / "msa_search").iterdir() if p.is_dir()) == ["hb_A", "hb_B"]
    pdir = out / "targets" / "hb" / (out / "targets" / "hb" / "CURRENT").read_text().strip()
    prov = json.loads((pdir / "provenance.json").read_text())
    assert [d["name"] for d in prov["config"]["msa_search"]["databases"]] == ["uniprot",
                                                                               "uniref90"]
    used = [m["path"] for m in prov["inputs"]["msa_files"]]
    assert any(p.endswith("hb_A/stockholm/uniprot.sto") for p in used)
    scores = json.loads((pdir / "scores.json").read_text())
    assert scores["msa_depth"] > 1 and [c["chain_id"] for c in scores["chains"]] == ["A", "B"]
