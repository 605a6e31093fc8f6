"""`protdp gate DIR --from colabfold|alphafold2|alphafold3|boltz` (issue 43, item 5): other
tools' predictions (built by benchmarks/interface_cases.py from the AlphaFold-Multimer fixture
and the corpus) through the same gate and review queue: our scores.json per target with the
interface rows `protdp interface` computes for the same files, flagged targets queued and bound
to the bytes of the files the tool wrote, a malformed prediction one row and the rest go on."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import sys

import pytest

from protdp.cli import main as protdp_main
from protdp.interface.readers import read_prediction
from protdp.interface.table import prediction_rows
from protdp.paths import REPO_ROOT, data_root
from protdp.review.store import ReviewStore
from test_complex_pairing import FIXTURE

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from interface_cases import build_cases  # noqa: E402


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return build_cases(tmp_path_factory.mktemp("ext"), FIXTURE, data_root())


def _summary(out):
    with open(out / "gate_summary.tsv") as fh:
        return {r["target"]: r for r in csv.DictReader(fh, delimiter="\t")}


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_colabfold_folder_through_gate_and_queue(tmp_path, cases, capsys):
    src = tmp_path / "colabfold"
    src.mkdir()
    for name in ("colabfold_fixture_4hhb", "colabfold_4hhb"):
        for f in cases[name]:
            shutil.copy(f, src / f.name)
    bad_scores, bad_pdb = cases["colabfold_fixture_2p90x2"]           # PAE one row short
    doc = json.loads(bad_scores.read_text())
    doc["pae"] = doc["pae"][:-1]
    (src / bad_scores.name).write_text(json.dumps(doc))
    shutil.copy(bad_pdb, src / bad_pdb.name)
    out, queue = tmp_path / "out", tmp_path / "q.sqlite"
    assert protdp_main(["gate", str(src), "--from", "colabfold", "--out", str(out),
                        "--queue-url", f"sqlite:///{queue}"]) == 0
    cap = capsys.readouterr()
    assert "3 targets: 0 accepted, 2 need review, 1 unreadable" in cap.out
    assert f"  error: fixture_2p90_A02_x2: {src / bad_scores.name}: field 'pae'" in cap.err, cap.err
    rows = _summary(out)
    assert rows["fixture_2p90_A02_x2"]["status"] == "error"
    assert f"{bad_scores.name}: field 'pae': PAE is 89x90" in rows["fixture_2p90_A02_x2"]["detail"]
    store = ReviewStore(str(queue))
    items = {i["target"]: store.get(i["id"]) for i in store.list()}
    for target, case in (("hb4", "colabfold_4hhb"), ("fixture_4hhb_hbA1-36_hbB1-40",
                                                      "colabfold_fixture_4hhb")):
        scores_path, pdb = cases[case]
        scores = json.loads((out / target / "scores.json").read_text())
        want = prediction_rows(read_prediction(scores_path, pdb), 10.0, 10.0)
        assert scores["interface_scores"] == json.loads(json.dumps(want))
        assert rows[target]["route"] == scores["route"] == "needs_review"
        assert scores["source"]["sha256"][pdb.name] == _sha(pdb)
        item = items[target]
        assert item["scores"]["interface_scores"] == scores["interface_scores"]
        assert item["file_sha256"]["pdb"] == _sha(pdb)                 # the tool's exact bytes
        assert item["file_sha256"]["pae"] == _sha(scores_path)
        assert item["reasons"] == scores["reasons"]
    hb4 = json.loads((out / "hb4" / "scores.json").read_text())
    assert [c["chain_id"] for c in hb4["chains"]] == list("ABCD") and hb4["iptm"] == 0.64
    store.close()
    # the tool's PAE file changes and the gate runs again into the same OUT: the copies there
    # are rewritten, so the old item (bound to the old bytes) is superseded by a new one
    scores_path, pdb = cases["colabfold_4hhb"]
    doc = json.loads((src / scores_path.name).read_text())
    doc["pae"][0][1] = round(doc["pae"][0][1] + 0.25, 2)
    (src / scores_path.name).write_text(json.dumps(doc))
    assert protdp_main(["gate", str(src), "--from", "colabfold", "--out", str(out),
                        "--queue-url", f"sqlite:///{queue}"]) == 0
    store = ReviewStore(str(queue))
    newest = max((i for i in store.list() if i["target"] == "hb4"), key=lambda i: i["id"])
    assert store.get(newest["id"])["file_sha256"]["pae"] == _sha(src / scores_path.name)
    store.close()


def test_alphafold3_boltz_and_alphafold2_layouts(tmp_path, cases, capsys):
    for source, case in (("alphafold3", "af3_4hhb_haem_tpo"), ("boltz", "boltz_2q2k_dna")):
        src = tmp_path / source
        src.mkdir()
        pae, structure = cases[case]
        for f in pae.parent.iterdir():
            stem = pae.name.split("_full_data")[0].removeprefix("pae_").removesuffix(".npz")
            if stem.removeprefix("fold_") in f.name:
                shutil.copy(f, src / f.name)
        out = tmp_path / f"out_{source}"
        assert protdp_main(["gate", str(src), "--from", source, "--out", str(out)]) == 0
        [(target, row)] = _summary(out).items()
        scores = json.loads((out / target / "scores.json").read_text())
        want = prediction_rows(read_prediction(pae, structure), 10.0, 10.0)
        assert row["status"] == "ok" and scores["interface_scores"] == json.loads(json.dumps(want))
        assert (out / target / "model.cif").read_bytes() == structure.read_bytes()
    # AlphaFold 2.3's folder: ranking_debug.json, ranked_0.pdb, pae_/confidence_<model>.json
    scores_path, pdb = cases["colabfold_fixture_4hhb"]
    cf = json.loads(scores_path.read_text())
    src = tmp_path / "af2"
    for target, with_pae in (("good", True), ("nopae", False), ("listconf", True)):
        d = src / target
        d.mkdir(parents=True)
        model = "model_1_multimer_v3_pred_0"
        (d / "ranking_debug.json").write_text(json.dumps({"order": [model]}))
        shutil.copy(pdb, d / "ranked_0.pdb")
        conf = cf["plddt"] if target == "listconf" else {"confidenceScore": cf["plddt"]}
        (d / f"confidence_{model}.json").write_text(json.dumps(conf))   # a list: one bad row
        if with_pae:
            (d / f"pae_{model}.json").write_text(json.dumps(
                [{"predicted_aligned_error": cf["pae"], "max_predicted_aligned_error": 31.75}]))
    out = tmp_path / "out_af2"
    assert protdp_main(["gate", str(src), "--from", "alphafold2", "--out", str(out)]) == 0
    rows = _summary(out)
    assert rows["nopae"]["status"] == "error" and "missing pae_" in rows["nopae"]["detail"]
    assert rows["listconf"]["status"] == "error", rows["listconf"]
    assert "confidence_model_1_multimer_v3_pred_0.json" in rows["listconf"]["detail"]
    scores = json.loads((out / "good" / "scores.json").read_text())
    want = prediction_rows(read_prediction(scores_path, pdb), 10.0, 10.0)
    for mine, theirs in zip(scores["interface_scores"], want):       # same PAE, same pLDDT
        assert {k: mine[k] for k in mine if k != "iptm_af"} == \
            {k: theirs[k] for k in theirs if k != "iptm_af"}
    assert "low_iptm" in scores["reasons"]        # AF2's ipTM lives in its pickle: unknown
    assert protdp_main(["gate", str(tmp_path / "empty_does_not_exist"), "--from", "boltz",
                        "--out", str(out)]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_gate_reads_the_queue_and_gating_flags_as_predict_does(monkeypatch):
    """`protdp gate` and `protdp predict` share --queue-url / --gating (one definition,
    `protdp.workflows.add_gate_arguments`): both take the queue from PROTDP_QUEUE_URL when
    --queue-url is not given, else None (OUT/review_queue.sqlite)."""
    from protdp.external.cli import _parser as gate_parser
    from protdp.inference.cli import build_parser as predict_parser

    gate_argv = ["dir", "--from", "boltz", "--out", "out", "--gating", "g.yaml"]
    predict_argv = ["--checkpoint", "ckpt", "--fasta", "t.fasta", "--out", "out",
                    "--gating", "g.yaml"]
    monkeypatch.setenv("PROTDP_QUEUE_URL", "postgresql://rev@db/queue")
    gate, predict = gate_parser().parse_args(gate_argv), predict_parser().parse_args(predict_argv)
    assert gate.queue_url == predict.queue_url == "postgresql://rev@db/queue"
    assert gate.gating == predict.gating == "g.yaml"
    monkeypatch.delenv("PROTDP_QUEUE_URL")
    assert gate_parser().parse_args(gate_argv).queue_url is None
    assert gate_parser().parse_args(gate_argv + ["--queue-url", "q.sqlite"]).queue_url == "q.sqlite"


def test_a_file_changed_while_gated_is_an_error_row(tmp_path, cases, monkeypatch):
    """The copies a reviewer is bound to are the bytes that were scored: a structure rewritten
    while the gate read it is that target's error row, and nothing is written or enqueued."""
    import protdp.external.gate as gate_mod

    src = tmp_path / "cf"
    src.mkdir()
    for f in cases["colabfold_4hhb"]:
        shutil.copy(f, src / f.name)
    real = gate_mod.read_prediction

    def read_then_rewrite(pae, structure, **kw):
        pred = real(pae, structure, **kw)
        structure.write_bytes(structure.read_bytes().replace(b"ATOM  ", b"ATOM  ", 1) + b"END\n")
        return pred
    monkeypatch.setattr(gate_mod, "read_prediction", read_then_rewrite)
    out, queue = tmp_path / "out", tmp_path / "q.sqlite"
    assert protdp_main(["gate", str(src), "--from", "colabfold", "--out", str(out),
                        "--queue-url", f"sqlite:///{queue}"]) == 1      # no target gated
    row = _summary(out)["hb4"]
    assert row["status"] == "error" and "changed while it was being gated" in row["detail"]
    assert not (out / "hb4").exists()
