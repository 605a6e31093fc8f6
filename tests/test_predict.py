"""Batch predictor end to end on real chains with a tiny randomly initialised checkpoint:
files written and parsable (Biopython and gemmi), B-factors = pLDDT = the model's own output,
provenance, resume, bad targets recorded while the batch goes on, ids never escape OUT,
screening hits routed to review, training-checkpoint loading (EMA preferred)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import gemmi
import numpy as np
import pytest
import torch
from Bio.PDB import MMCIFParser, PDBParser
from hypothesis import given, settings
from hypothesis import strategies as st

from protdp import __version__
from protdp.cli import main as protdp_main
from protdp.data.features import collate, featurize_query
from protdp.data.parse import parse_msa, parse_structure
from protdp.errors import InputError
from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
from protdp.gating import GatePolicy
from protdp.inference.predictor import PredictConfig
from protdp.workflows import predict
from protdp.inference.targets import clean_sequence, read_targets
from protdp.inference.writers import ONE_TO_THREE, read_summary, safe_name
from protdp.model import build_model
from protdp.paths import REPO_ROOT
from protdp.review.store import ReviewStore
from protdp.inference.layout import current_prediction

sys.path.insert(0, str(REPO_ROOT / "pipelines"))
from demo import chains_from_pairs, predict_chains  # noqa: E402  (the demo's own glue)

TINY = REPO_ROOT / "configs" / "model" / "tiny.yaml"
CFG = PredictConfig(max_length=120, max_msa_rows=16)
PERMISSIVE = GatePolicy(accept_mean_plddt=0.0, max_very_low_fraction=1.0, min_msa_depth=1,
                        review_beyond_training_crop=False)


def tiny_model(seed: int = 0, noise: float = 0.3):
    """Random init plus noise on every weight, so the zero-initialised output layers give
    residue-dependent pLDDT and spread-out coordinates."""
    torch.manual_seed(seed)
    model = build_model(TINY, verbose=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise)
    return model


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_model_checkpoint(tiny_model(), None, tmp_path_factory.mktemp("ckpt") / "tiny.pt",
                                 training_crop=32, max_msa_rows=16)


@pytest.fixture(scope="module")
def chain_2p90(data_dir):
    chain = parse_structure(data_dir / "structures" / "2p90_A02.pdb")
    return chain.sequence, data_dir / "msa" / "2p90_A02.hhblits_subsample.a3m"


def write_inputs(tmp_path, records, msas=None):
    fasta = tmp_path / "targets.fasta"
    fasta.write_text("".join(f">{tid}\n{seq}\n" for tid, seq in records))
    msa_dir = tmp_path / "msa"
    msa_dir.mkdir(exist_ok=True)
    for name, src in (msas or {}).items():
        (msa_dir / name).write_bytes(src.read_bytes() if hasattr(src, "read_bytes") else src.encode())
    return fasta, msa_dir


def test_end_to_end_real_chain(tmp_path, ckpt, chain_2p90):
    seq, msa_path = chain_2p90
    fasta, msa_dir = write_inputs(tmp_path, [("2p90_A02", seq)], {"2p90_A02.a3m": msa_path})
    out = tmp_path / "out"
    res = predict(ckpt, fasta, out, msa_dir=msa_dir, config=CFG, progress=False, release_gate="off")

    tdir = current_prediction(out / "targets" / "2p90_A02")
    scores = json.loads((tdir / "scores.json").read_text())
    prov = json.loads((tdir / "provenance.json").read_text())
    plddt = np.array(scores["plddt"])
    assert scores["sequence"] == seq and len(plddt) == len(seq) == 45
    assert plddt.std() > 0.05, "pLDDT should vary per residue with this checkpoint"

    # the model's own output on the same inputs (independent run)
    loaded = load_model_checkpoint(ckpt)
    feats = featurize_query(seq, parse_msa(msa_path), max_msa_rows=16, masked_msa_fraction=0.15,
                            msa_samples=loaded.config.num_recycles + 1)
    with torch.no_grad():
        ref = loaded.model(collate([feats]))
    ref_plddt = ref["plddt"][0].numpy()
    ref_ca = ref["final_atom_positions"][0, :, 1].numpy()
    np.testing.assert_allclose(plddt, ref_plddt, atol=0.0051)
    assert scores["mean_plddt"] == pytest.approx(plddt.mean())
    assert scores["msa_depth"] == parse_msa(msa_path).depth and scores["msa_rows_used"] == 16

    # both files open in Biopython and gemmi; B-factor of every atom = that residue's pLDDT
    for kind, bio in (("pdb", PDBParser(QUIET=True)), ("cif", MMCIFParser(QUIET=True))):
        path = tdir / f"2p90_A02.{kind}"
        structure = bio.get_structure("x", str(path))
        residues = list(structure[0]["A"])
        assert [r.get_resname() for r in residues] == [ONE_TO_THREE[a] for a in seq]
        for i, r in enumerate(residues):
            assert all(abs(a.get_bfactor() - plddt[i]) < 1e-6 for a in r)
            np.testing.assert_allclose(r["CA"].coord, ref_ca[i], atol=2e-3)
            assert ("CB" in r) == (seq[i] != "G")
        gs = gemmi.read_structure(str(path))
        g_res = list(gs[0]["A"])
        assert gemmi.one_letter_code([r.name for r in g_res]).upper() == seq
        g_b = np.array([[a.b_iso for a in r] for r in g_res], dtype=object)
        for i, bs in enumerate(g_b):
            assert np.allclose(bs, plddt[i], atol=1e-3)

    # provenance: checkpoint + input digests, config, version, time, clinical notice, routing
    assert prov["checkpoint"]["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert prov["inputs"]["fasta_sha256"] == hashlib.sha256(fasta.read_bytes()).hexdigest()
    assert prov["inputs"]["sequence_sha256"] == hashlib.sha256(seq.encode()).hexdigest()
    assert prov["inputs"]["msa_files"][0]["sha256"] == hashlib.sha256(msa_path.read_bytes()).hexdigest()
    assert prov["protdp_version"] == __version__ and re.match(r"\d{4}-\d\d-\d\dT", prov["created_at"])
    assert prov["not_for_clinical_use"] is True and "clinical" in prov["notice"]
    assert prov["config"]["model"]["c_m"] == 16 and prov["config"]["predict"]["max_msa_rows"] == 16
    assert prov["attention"] == {"attention_backend": "auto", "attention_kernel_train": "recompute",
                                 "attention_kernel_infer": "sdpa_flash_cpu"}

    # gate: random weights give mean pLDDT ~50 (< 70) and 45 > training crop 32 -> review
    assert prov["gate"]["route"] == scores["route"] == "needs_review"
    assert {"low_mean_plddt", "length_beyond_training_crop"} <= set(scores["reasons"])
    rows = read_summary(out / "summary.tsv")
    assert [(r["target"], r["route"], r["status"]) for r in rows] == [
        ("2p90_A02", "needs_review", "predicted")]
    assert float(rows[0]["mean_plddt"]) == pytest.approx(plddt.mean(), abs=0.006)
    items = ReviewStore(res.queue_url).list()
    assert [(i["target"], set(i["reasons"])) for i in items] == [("2p90_A02", set(scores["reasons"]))]
    assert items[0]["folder"] == str(tdir) and items[0]["paths"]["pdb"] == "2p90_A02.pdb"


def test_resume_skips_complete_targets(tmp_path, ckpt, data_dir):
    records = [("a", "MKTAYIAKQRQISFVKSHFSRQ"), ("b", "GSHMLEDPVDAFQ"), ("c", "MQIFVKTLTGK")]
    fasta, msa_dir = write_inputs(tmp_path, records)
    out = tmp_path / "out"
    first = predict(ckpt, fasta, out, msa_dir=msa_dir, config=CFG, progress=False, release_gate="off")
    assert [r["status"] for r in first.rows] == ["predicted"] * 3
    stamp = {t: os.stat(current_prediction(out / "targets" / t) / "provenance.json").st_mtime_ns for t in "abc"}
    n_items = len(ReviewStore(first.queue_url).list(state=None))

    again = predict(ckpt, fasta, out, msa_dir=msa_dir, config=CFG, progress=False, release_gate="off")
    assert [r["status"] for r in again.rows] == ["skipped"] * 3
    assert [r["route"] for r in again.rows] == [r["route"] for r in first.rows]
    assert {t: os.stat(current_prediction(out / "targets" / t) / "provenance.json").st_mtime_ns for t in "abc"} == stamp
    assert len(ReviewStore(first.queue_url).list(state=None)) == n_items

    # an incomplete target (lost structure file) and a changed input (new MSA) are redone
    (current_prediction(out / "targets" / "a") / "a.pdb").unlink()
    (msa_dir / "b.a3m").write_text(">b\nGSHMLEDPVDAFQ\n>hom\nGSHMLEDPVDAYQ\n")
    third = predict(ckpt, fasta, out, msa_dir=msa_dir, config=CFG, progress=False, release_gate="off")
    assert [r["status"] for r in third.rows] == ["predicted", "predicted", "skipped"]
    assert (current_prediction(out / "targets" / "a") / "a.pdb").is_file()
    assert json.loads((current_prediction(out / "targets" / "b") / "scores.json").read_text())["msa_depth"] == 2

    # a re-run against another queue skips the work but still queues every flagged target
    other = predict(ckpt, fasta, out, msa_dir=msa_dir, config=CFG, progress=False, release_gate="off",
                    queue_url=str(tmp_path / "other.sqlite"))
    assert [r["status"] for r in other.rows] == ["skipped"] * 3
    flagged = sorted(r["target"] for r in other.rows if r["route"] == "needs_review")
    assert flagged and sorted(i["target"] for i in ReviewStore(other.queue_url).list()) == flagged


def test_pae_head_scores_and_masked_queue_password(tmp_path):
    from protdp.config import load_config, read_yaml
    from protdp.workflows import review_commands
    from protdp.model.config import ModelConfig

    torch.manual_seed(3)
    cfg = load_config(ModelConfig, {**read_yaml(TINY), "pae_head": True})
    ckpt = save_model_checkpoint(build_model(cfg, verbose=False), None, tmp_path / "pae.pt")
    fasta, _ = write_inputs(tmp_path, [("p", "MKTAYIAKQRQISF")])
    res = predict(ckpt, fasta, tmp_path / "out", config=CFG, progress=False, release_gate="off")
    scores = json.loads((current_prediction(tmp_path / "out" / "targets" / "p") / "scores.json").read_text())
    pae = np.array(scores["pae"])
    assert pae.shape == (14, 14) and np.all(pae >= 0) and 0 <= scores["ptm"] <= 1
    assert res.rows[0]["ptm"] == pytest.approx(scores["ptm"])
    assert float(read_summary(tmp_path / "out" / "summary.tsv")[0]["ptm"]) == pytest.approx(
        scores["ptm"], abs=0.006)
    cmd = review_commands("postgresql://alice:s3cret@db.example:5432/queue")
    assert "s3cret" not in cmd and "postgresql://alice:***@db.example:5432/queue" in cmd


def test_bad_targets_are_recorded_and_the_batch_goes_on(tmp_path, ckpt, data_dir, chain_2p90):
    seq, msa_path = chain_2p90
    bad_a3m = ">q\nMKTAYIAK\n>r1\nMKTAYIA\n"           # second row one column short
    records = [("ok1", "MKTAYIAKQRQISFVKSHFSRQ"), ("digits", "MKT4YIAK"), ("long", "A" * 121),
               ("mismatch", seq), ("badmsa", "MKTAYIAK"), ("empty", ""), ("allx", "XXXXXXXXXXXX"),
               ("ok1", "MKTAYIAK"), ("ok2", "gshm LEDP\tvdafq")]
    fasta, msa_dir = write_inputs(tmp_path, records, {
        "mismatch.a3m": data_dir / "msa" / "2q2k_A.bfd_uniclust.a3m", "badmsa.a3m": bad_a3m})
    out = tmp_path / "out"
    res = predict(ckpt, fasta, out, msa_dir=msa_dir, config=CFG, progress=False, release_gate="off")
    by = [(r["target"], r["route"], r["detail"]) for r in res.rows]
    assert [b[1] for b in by] == ["needs_review", "rejected", "rejected", "rejected", "rejected",
                                  "rejected", "rejected", "rejected", "needs_review"]
    expect = ["", "invalid character '4' (U+0034) at position 4", "length 121 exceeds",
              "does not match", "(record 2) has 7 aligned columns but the query has 8", "empty sequence",
              "12 of 12 residues are unknown", "duplicate target id (first defined at line 1)", ""]
    for (tid, _, detail), want in zip(by, expect):
        assert want in detail, (tid, detail)
    assert "badmsa.a3m:4" in by[4][2] and "mismatch.a3m" in by[3][2]
    # a bad sequence names its file and the record's line (issue 28: the README promises it)
    assert by[1][2].startswith(f"{fasta}:3: ") and by[2][2].startswith(f"{fasta}:5: ")
    rows = read_summary(out / "summary.tsv")
    assert [r["target"] for r in rows] == [t for t, _ in records]
    assert all(r["reasons"] == "invalid_input" for r in rows if r["route"] == "rejected")
    # lowercase and whitespace are normalised, not rejected
    assert json.loads((current_prediction(out / "targets" / "ok2") / "scores.json").read_text())["sequence"] == "GSHMLEDPVDAFQ"
    # nothing is written for rejected targets
    assert sorted(p.name for p in (out / "targets").iterdir()) == ["ok1", "ok2"]


def test_target_ids_never_write_outside_out(tmp_path, ckpt):
    ids = ["../../escape", "/tmp/abs_escape", "..", ".", "a/b\\c", "x" * 300, "naïve",
           "ctl\x1b[2Jid", "ok"]
    fasta, msa_dir = write_inputs(tmp_path, [(i, "MKTAYIAKQR") for i in ids])
    work = tmp_path / "deep" / "er"
    work.mkdir(parents=True)
    out = work / "out"
    before = set(tmp_path.rglob("*"))
    res = predict(ckpt, fasta, out, msa_dir=msa_dir, config=CFG, progress=False, release_gate="off",
                  queue_url=str(tmp_path / "queue.sqlite"))
    created = {p for p in set(tmp_path.rglob("*")) - before}
    outside = [p for p in created if not (p == work or p.is_relative_to(out))
               and not p.name.startswith("queue.sqlite")]
    assert outside == [], outside
    assert not os.path.exists("/tmp/abs_escape")
    assert [r["route"] for r in res.rows] == ["needs_review"] * len(ids)
    names = sorted(p.name for p in (out / "targets").iterdir())
    assert len(names) == len(ids) and "ok" in names
    for r in res.rows:
        name = r["file_name"]
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", name) and ".." not in name
        assert json.loads((current_prediction(out / "targets" / name) / "scores.json").read_text())["target"] == r["target"]
    tsv = (out / "summary.tsv").read_text()
    assert "\x1b" not in tsv and "ctl\\x1b[2Jid" in tsv


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=120), st.text(min_size=0, max_size=120))
def test_safe_name_is_a_safe_injective_file_name(a, b):
    for tid in (a, b):
        name = safe_name(tid)
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name) and ".." not in name
        assert name == safe_name(tid) and (name == tid) == (
            re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,51}[A-Za-z0-9])?", tid) is not None
            and ".." not in tid)
    if a != b:   # (a crafted id equal to another's hashed name is caught by read_targets)
        assert safe_name(a) != safe_name(b)


def test_safe_name_and_sequence_rules():
    assert safe_name("T1042") == "T1042" and safe_name("a..b") != "a..b"
    assert safe_name("a b") != safe_name("a_b") and safe_name("A") != safe_name("a")
    long = safe_name("y" * 500)
    assert len(long) <= 64 and long == safe_name("y" * 500) != safe_name("y" * 499)
    assert clean_sequence(" mk\tv ", max_length=10, max_unknown_fraction=0.5) == "MKV"
    assert clean_sequence("MKBZ", max_length=10, max_unknown_fraction=0.5) == "MKBZ"
    for bad, msg in [("MK-V", "gap character"), ("MKＶ", "U+FF36"), ("MK\x07", "U+0007"),
                     ("MKé", "U+00E9"), ("MKBZX", "3 of 5"), ("M" * 11, "exceeds")]:
        with pytest.raises(InputError, match=re.escape(msg)):
            clean_sequence(bad, max_length=10, max_unknown_fraction=0.5)


def test_fasta_record_problems(tmp_path):
    f = tmp_path / "t.fa"
    f.write_bytes(b"MKV\n>\nMKV\n>a desc\nMK\nV\n>a\nMKV\n>A\nMKV\n>ctl\x1cx\r\nMKV\r\n")
    t = read_targets(f)
    assert [(x.target_id, x.raw_sequence) for x in t] == [
        ("<no header, line 1>", "MKV"), ("", "MKV"), ("a", "MKV"), ("a", "MKV"), ("A", "MKV"),
        ("ctl", "MKV")]  # str.split(): \x1c is whitespace, so the id is "ctl"
    assert "before the first '>'" in t[0].error and "empty FASTA header" in t[1].error
    assert t[2].error is None and "duplicate target id (first defined at line 4)" in t[3].error
    # 'A' and 'a' would share a folder on a case-insensitive file system
    assert "file name 'A' collides with that of target 'a'" in t[4].error and t[5].error is None
    empty = tmp_path / "e.fa"
    empty.write_text("\n\n")
    with pytest.raises(InputError, match="no FASTA records"):
        read_targets(empty)


def test_screening_hit_is_routed_to_review(tmp_path, ckpt):
    """Issue 7 deliverable 2 (predictor half): with a gate that would otherwise accept, a
    screening hit -> needs_review with reason `screening`; the clean control is accepted."""
    demo = REPO_ROOT / "configs" / "screening" / "demo_list.fasta"
    ubiquitin = "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG"
    fused = "GSGSGS" + ubiquitin[10:40] + "GSGSGS"                 # a 30-residue stretch inside
    fasta, msa_dir = write_inputs(tmp_path, [("ubq", ubiquitin), ("fused", fused),
                                             ("control", "MKTAYIAKQRQISFVKSHFSRQ")])
    res = predict(ckpt, fasta, tmp_path / "out", msa_dir=msa_dir, config=CFG, gating=PERMISSIVE,
                  screening=demo, progress=False, release_gate="off")
    assert [(r["route"], r["reasons"]) for r in res.rows] == [
        ("needs_review", ["screening"]), ("needs_review", ["screening"]), ("accepted", [])]
    scores = json.loads((current_prediction(tmp_path / "out" / "targets" / "fused") / "scores.json").read_text())
    assert scores["screening_hits"][0]["query_start"] == 6 and "UBC_HUMAN" in scores["details"]["screening"]
    items = ReviewStore(res.queue_url).list(reason="screening")
    assert sorted(i["target"] for i in items) == ["fused", "ubq"]
    # the same batch without the list: the gate accepts them (so `screening` was the cause)
    plain = predict(ckpt, fasta, tmp_path / "out2", msa_dir=msa_dir, config=CFG,
                    gating=PERMISSIVE, progress=False, release_gate="off")
    assert [r["route"] for r in plain.rows] == ["accepted"] * 3


def test_demo_hook_counts_and_review_command(tmp_path, ckpt, data_dir):
    (pid, seq, msas), = chains_from_pairs(["2q2k_A"], data_dir / "PAIRS.tsv")
    assert len(seq) == 70 and len(msas) == 4                 # four searches of one chain
    chains = [(pid, seq, msas), ("5awl_A", "YYDPETGTWY", data_dir / "msa" / "5awl_A.single_seq.a3m"),
              ("bad", "MK?", None)]
    demo = predict_chains(ckpt, chains, tmp_path / "demo", progress=False, release_gate="off")
    assert demo.counts == {"accepted": 0, "needs_review": 2, "rejected": 1}
    scores = json.loads((current_prediction(tmp_path / "demo" / "targets" / "2q2k_A") / "scores.json").read_text())
    merged = {parse_msa(m).sequences[i] for m in msas for i in range(parse_msa(m).depth)}
    assert 1 < scores["msa_depth"] <= len(merged)            # the four MSAs were merged
    with pytest.raises(InputError, match="not in"):
        chains_from_pairs(["nope"], data_dir / "PAIRS.tsv")
    assert "protdp review serve --queue-url" in demo.review_command
    assert str(tmp_path / "demo" / "review_queue.sqlite") in demo.review_command
    assert len(ReviewStore(demo.queue_url).list()) == 2


def test_cli_clear_errors(tmp_path, ckpt, capsys):
    fasta, msa_dir = write_inputs(tmp_path, [("a", "MKV")])
    assert protdp_main(["predict", "--checkpoint", str(tmp_path / "nope.pt"), "--fasta",
                        str(fasta), "--out", str(tmp_path / "o")]) == 2
    assert "nope.pt: checkpoint not found" in capsys.readouterr().err
    model = tiny_model()
    with torch.no_grad():
        next(iter(model.structure_module.parameters())).view(-1)[0] = float("nan")
    bad = save_model_checkpoint(model, None, tmp_path / "nan.pt")
    assert protdp_main(["predict", "--checkpoint", str(bad), "--fasta", str(fasta), "--out",
                        str(tmp_path / "o")]) == 2
    assert "non-finite values (NaN/Inf) in weight 'structure_module." in capsys.readouterr().err
    assert protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out",
                        str(tmp_path / "o"), "--no-progress", "--msa-dir", str(msa_dir)]) == 2
    assert "is not released: no release record" in capsys.readouterr().err
    assert protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out",
                        str(tmp_path / "o"), "--no-progress", "--msa-dir", str(msa_dir),
                        "--allow-unreleased"]) == 0
    assert "1 targets: 0 accepted, 1 need review, 0 rejected" in capsys.readouterr().out


def test_unreachable_queue_stops_the_batch(tmp_path, ckpt, capsys):
    """A flagged prediction that cannot be queued must not be marked complete (nor turned into
    a 'rejected' row): the run stops with a clear error and a re-run redoes the target."""
    fasta, _ = write_inputs(tmp_path, [("a", "MKTAYIAKQR")])
    out = tmp_path / "o"
    rc = protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out",
                      str(out), "--no-progress", "--allow-unreleased", "--queue-url",
                      "postgresql://nobody:pw@127.0.0.1:9/none"])
    err = capsys.readouterr().err
    assert rc == 2 and "review queue" in err and "pw@" not in err
    # issue 47: the queue is checked before the first prediction, so nothing is published
    # without provenance (main published the folder, then failed)
    assert not (out / "targets" / "a").exists()
    assert current_prediction(out / "targets" / "a") is None


def test_flagged_prediction_opens_in_the_review_ui(tmp_path, ckpt):
    """Contract with protdp.review.web: the item page shows the predictor's pLDDT, reasons
    and escaped target name, and serves the written PDB."""
    from fastapi.testclient import TestClient

    from protdp.review.web import create_app

    fasta, _ = write_inputs(tmp_path, [("<b>x</b>", "MKTAYIAKQRQISF")])
    res = predict(ckpt, fasta, tmp_path / "out", config=CFG, progress=False, release_gate="off")
    store = ReviewStore(res.queue_url)
    token = store.admin(store.init_admin()).add_reviewer("alice")
    client = TestClient(create_app(store, secret=b"s" * 32))
    page = client.get("/login")
    csrf = re.search(r'name="login_csrf" value="(\w+)"', page.text).group(1)
    assert client.post("/login", data={"token": token, "login_csrf": csrf, "next": "/queue"},
                       follow_redirects=False).status_code == 303
    item = client.get("/items/1")
    assert item.status_code == 200
    assert "&lt;b&gt;x&lt;/b&gt;" in item.text and "<b>x</b>" not in item.text
    assert "shallow_msa" in item.text and "<polyline" in item.text
    pdb = client.get("/items/1/files/pdb")
    assert pdb.status_code == 200 and pdb.text == Path(res.rows[0]["paths"]["pdb"]).read_text()
