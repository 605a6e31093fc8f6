"""Batch prediction of a proteome (issue 30): ensembles ranked as AlphaFold ranks them, one
folder per prediction id, the files downstream tools parse (read back with json, numpy, gemmi,
Biopython), rerun / crash / new-prediction behaviour, early stop, out-of-memory retries,
folder / CSV inputs, length^2 sharding and the ensemble_disagreement gate reason."""

from __future__ import annotations

import csv
import datetime as dt
import json
import time

import gemmi
import numpy as np
import pytest
import torch
import yaml
from Bio.PDB import PDBParser

from protdp.gating import GatePolicy, route
from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
from protdp.inference.layout import CURRENT_FILE, current_prediction
from protdp.inference.memory import (TargetSize, choose_chunk_size, predicted_peak_bytes,
                                     smaller_chunks)
from protdp.inference.predictor import PredictConfig
from protdp.inference.recycling import CA_INDEX, ca_distance_change
from protdp.inference.sharding import shard_by_cost
from protdp.model.model import build_model
from protdp.paths import REPO_ROOT
from protdp.review.binding import mismatches
from protdp.review.store import ReviewStore
from protdp.workflows import predict

TINY = yaml.safe_load((REPO_ROOT / "configs" / "model" / "tiny.yaml").read_text())
CFG = dict(max_length=120, max_msa_rows=16, plots=False)
SEQS = {"short": "MKTAYIAKQRQISFV", "long": "GSHMLEDPVDAFQKLAEEALRRAVEEGK", "mid": "MQIFVKTLTGKTITLE"}


def _model(seed: int):
    torch.manual_seed(seed)
    model = build_model({**TINY, "pae_head": True}, verbose=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ens")
    return [save_model_checkpoint(_model(s), None, d / f"m{s}.pt", training_crop=64, max_msa_rows=16)
            for s in (1, 2)]


RELAX_TIMEOUT_S = 1.0     # timings only: the random-weight prediction is not relaxable


def assert_relax_timing(pdir, timings: dict, order: list[str]) -> None:
    """--relax: timings.json has AlphaFold's `relax_<model>` entry for the relaxed (top-ranked)
    model only, at least the seconds relax.json reports (to its 2 decimals; the wall time around
    it) and within its time bound plus the reading and writing around the child process."""
    relax = json.loads((pdir / "relax.json").read_text())
    assert relax["model"] == order[0]
    assert [k for k in timings if k.startswith("relax_")] == [f"relax_{order[0]}"]
    assert relax["seconds"] - 0.01 <= timings[f"relax_{order[0]}"] <= RELAX_TIMEOUT_S + 5.0


def _fasta(tmp_path, names=("short", "long", "mid")):
    f = tmp_path / "t.fasta"
    f.write_text("".join(f">{n}\n{SEQS[n]}\n" for n in names))
    return f


def test_ensemble_outputs_read_back(tmp_path, ckpts):
    out = tmp_path / "out"
    res = predict(ckpts, _fasta(tmp_path, ("long",)), out, progress=False, release_gate="off",
                  config=PredictConfig(**{**CFG, "plots": True}, num_seeds=2, seed=7,
                                       relax=True, relax_timeout_s=RELAX_TIMEOUT_S))
    pdir = current_prediction(out / "targets" / "long")
    assert pdir.parent == out / "targets" / "long" and len(pdir.name) == 16
    names = [f"model_{m}_seed_{s:03d}" for m in (1, 2) for s in (7, 8)]
    # ranking_debug.json in AlphaFold's shape, order = mean pLDDT of each result file, best first
    debug = json.loads((pdir / "ranking_debug.json").read_text())
    assert set(debug) == {"plddts", "ptm", "order"} and set(debug["plddts"]) == set(names)
    results = {n: np.load(pdir / f"result_{n}.npz") for n in names}
    means = {n: float(r["plddt"].mean()) for n, r in results.items()}
    assert debug["order"] == sorted(names, key=lambda n: -means[n])
    assert all(abs(debug["plddts"][n] - means[n]) < 1e-4 for n in names)   # full floats
    assert all(debug["ptm"][n] == pytest.approx(float(results[n]["ptm"])) for n in names)
    assert set(results[names[0]].files) == {"plddt", "ranking_confidence", "num_recycles",
                                            "predicted_aligned_error", "ptm",
                                            "max_predicted_aligned_error"}   # slim: no distogram
    # ranked_K.pdb is the K-th best unrelaxed model (Biopython)
    parser = PDBParser(QUIET=True)
    for k, n in enumerate(debug["order"]):
        a = parser.get_structure("a", pdir / f"ranked_{k}.pdb")
        b = parser.get_structure("b", pdir / f"unrelaxed_{n}.pdb")
        np.testing.assert_array_equal([x.coord for x in a.get_atoms()], [x.coord for x in b.get_atoms()])
        bf = np.array([r["CA"].get_bfactor() for r in a[0]["A"]])
        np.testing.assert_allclose(bf, results[n]["plddt"], atol=0.006)
    top = results[debug["order"][0]]
    # AFDB PAE JSON (AFDB's own file name) and ColabFold scores of the top model
    pae = json.loads((pdir / "AF-long-F1-predicted_aligned_error_v4.json").read_text())
    assert isinstance(pae, list) and pae[0]["max_predicted_aligned_error"] == pytest.approx(31.75)
    # PAE as AlphaFold's confidence.pae_json writes it: float64 rounded to 1 decimal, so no
    # float32 noise (3.1400001049041748) in the JSON text; scores.json's `pae` the same values;
    # the ColabFold scores keep 2 decimals, also without the noise
    raw = top["predicted_aligned_error"]                                   # float32 [L, L]
    assert raw.dtype == np.float32 and (raw.astype(np.float64) != raw.round(1)).any()
    np.testing.assert_array_equal(pae[0]["predicted_aligned_error"],
                                  np.round(raw.astype(np.float64), 1))
    assert all(len(repr(v).split(".")[1]) == 1 for row in pae[0]["predicted_aligned_error"]
               for v in row)
    assert json.loads((pdir / "scores.json").read_text())["pae"] == pae[0]["predicted_aligned_error"]
    cf = json.loads((pdir / f"long_scores_rank_001_protdp_{debug['order'][0]}.json").read_text())
    assert all(len(repr(v).split(".")[1]) <= 2 for row in cf["pae"] for v in row)
    np.testing.assert_allclose(cf["pae"], raw, atol=0.005 + 1e-6)
    assert cf["ptm"] == pytest.approx(float(top["ptm"]), abs=1e-4)
    assert cf["max_pae"] == pytest.approx(float(raw.max()))       # the matrix maximum
    v1 = json.loads((pdir / "long_predicted_aligned_error_v1.json").read_text())   # ColabFold's
    assert v1 == {"predicted_aligned_error": cf["pae"], "max_predicted_aligned_error":
                  cf["max_pae"]}
    # ModelCIF: per-residue pLDDT in _ma_qa_metric_local, global pLDDT/pTM (gemmi)
    block = gemmi.cif.read(str(pdir / "long.cif")).sole_block()
    local = block.find("_ma_qa_metric_local.", ["model_id", "metric_value"])
    local = np.array([float(r[1]) for r in local if r[0] == "1"])        # the top-ranked model
    np.testing.assert_allclose(local, top["plddt"], atol=0.006)
    glob = block.find("_ma_qa_metric_global.", ["model_id", "metric_value"])
    glob = [float(r[1]) for r in glob if r[0] == "1"]
    assert glob == pytest.approx([round(float(np.round(top["plddt"], 2).mean()), 2),
                                  round(float(top["ptm"]), 4)], abs=0.01)
    assert gemmi.one_letter_code([r.name for r in gemmi.read_structure(str(pdir / "long.cif"))[0][0]]) \
        .upper() == SEQS["long"]
    assert "protdp" in "".join(block.find_values("_software.name"))
    for png in ("long_plddt.png", "long_pae.png", "long_coverage.png"):
        assert (pdir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    timings = json.loads((pdir / "timings.json").read_text())
    assert {"features", *(f"predict_and_compile_{n}" for n in names)} <= set(timings)
    assert_relax_timing(pdir, timings, debug["order"])
    # scores.json: the ensemble and its spread; summary.csv: one line per (model, seed)
    scores = json.loads((pdir / "scores.json").read_text())
    assert scores["top_model"] == debug["order"][0] and len(scores["ensemble"]) == 4
    assert set(scores["ensemble_spread"]["ca_rmsd_to_top"]) == set(debug["order"][1:])
    with open(out / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["id"], r["model"], r["seed"], r["rank"]) for r in rows] == [
        ("long", str(int(n.split("_")[1])), str(int(n.split("_")[3])), str(k + 1))
        for k, n in enumerate(debug["order"])]
    assert all(r["route"] == res.rows[0]["route"] and r["length"] == "28" for r in rows)
    # every file of the prediction went to the queue with the item
    items = ReviewStore(res.queue_url).list()
    assert len(items) == 1 and items[0]["folder"] == str(pdir)
    assert {"ranked_0", "pae_json", "cif", "pdb", "timings", "ranking_debug"} <= set(items[0]["paths"])


def test_rerun_new_prediction_and_crash_recovery(tmp_path, ckpts):
    fasta, out = _fasta(tmp_path, ("short", "mid")), tmp_path / "out"
    kw = dict(progress=False, release_gate="off")
    first = predict(ckpts[0], fasta, out, config=PredictConfig(**CFG), **kw)
    store = ReviewStore(first.queue_url)
    old = current_prediction(out / "targets" / "short")
    stamp = {p.name: p.stat().st_mtime_ns for p in old.iterdir()}
    again = predict(ckpts[0], fasta, out, config=PredictConfig(**CFG), **kw)
    assert [r["status"] for r in again.rows] == ["skipped"] * 2
    assert len(store.list(state=None)) == 2                    # nothing enqueued again
    # new seeds: a new folder and a new item; the old folder is untouched
    new = predict(ckpts[0], fasta, out, config=PredictConfig(**CFG, seed=3), **kw)
    assert [r["status"] for r in new.rows] == ["predicted"] * 2
    cur = current_prediction(out / "targets" / "short")
    assert cur != old and (out / "targets" / "short" / CURRENT_FILE).read_text().strip() == cur.name
    assert {p.name: p.stat().st_mtime_ns for p in old.iterdir()} == stamp
    assert len(store.list(state=None)) == 4
    # a crash while writing leaves a hidden partial build (and no published folder): it is
    # removed and the prediction redone, and its item, bound to bytes that are gone, is
    # superseded by a new one bound to the redone files; a crash after publishing (no
    # provenance.json): the item is enqueued again (idempotent), the files left untouched
    import shutil
    stale = {r["target"]: r for r in store.list(state=None)
             if r["prediction_id"].endswith(cur.name)}["short"]
    # the redone files differ from the bound ones only through provenance.json's created_at
    # (seconds): wait for the clock to pass it, or a fast machine redoes identical bytes, which
    # rightly keep their item (test_review_trust covers that case)
    created = json.loads((cur / "provenance.json").read_text())["created_at"]
    while dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds") <= created:
        time.sleep(0.05)
    shutil.rmtree(cur)
    partial = out / "targets" / "short" / f".{cur.name}.partial-99999"
    partial.mkdir()
    (partial / "scores.json").write_text("{half")
    mid = current_prediction(out / "targets" / "mid")
    (mid / "provenance.json").unlink()
    mid_stamp = {p.name: p.stat().st_mtime_ns for p in mid.iterdir()}
    rerun = predict(ckpts[0], fasta, out, config=PredictConfig(**CFG, seed=3), **kw)
    assert [r["status"] for r in rerun.rows] == ["predicted", "predicted"]
    assert not partial.exists() and (cur / "provenance.json").is_file()
    assert (mid / "provenance.json").is_file()
    assert {p.name: p.stat().st_mtime_ns for p in mid.iterdir() if p.name != "provenance.json"} \
        == mid_stamp
    items = {r["id"]: r for r in store.list(state=None)}
    redone = items[rerun.rows[0]["review_item"]]
    assert len(items) == 5 and redone["prediction_id"] == stale["prediction_id"] + "~2"
    assert items[stale["id"]]["superseded_by"] == redone["id"]
    assert mismatches(redone) == [] and mismatches(items[stale["id"]])   # approvable: the new
    again = predict(ckpts[0], fasta, out, config=PredictConfig(**CFG, seed=3), **kw)
    assert [r["review_item"] for r in again.rows] == [r["review_item"] for r in rerun.rows]
    assert len(store.list(state=None)) == 5 and store.verify()["ok"]


def test_out_of_memory_retries_with_smaller_chunks_then_fails(tmp_path, ckpts):
    """Simulated OOM: the model fails while its Evoformer chunk size is unset or above 4 (the
    retry must reach the blocks); a target failing at every size is recorded, the batch goes on."""
    loaded = load_model_checkpoint(ckpts[0])
    blocks = [m for m in loaded.model.modules() if hasattr(m, "chunk_size")]
    assert blocks
    real = loaded.model.forward
    seen = []

    def flaky(batch, *a, **k):
        cs = blocks[0].chunk_size
        seen.append(cs)
        L = batch["aatype"].shape[-1]
        if L > 20 or cs is None or cs > 4:          # 'long' never fits
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(batch, *a, **k)

    loaded.model.forward = flaky
    res = predict(loaded, _fasta(tmp_path, ("short", "long")), tmp_path / "out", progress=False,
                  release_gate="off", config=PredictConfig(**CFG))
    short, long_ = res.rows
    assert short["status"] == "predicted" and short["ensemble"][0]["chunk_size"] == 3
    assert [r.split(":")[0] for r in short["ensemble"][0]["oom_retries"]] == ["chunk none", "chunk 7"]
    assert long_["route"] == "rejected" and "out of memory with every chunk size" in long_["detail"]
    assert all(b.chunk_size == loaded.config.chunk_size for b in blocks)   # restored
    rows = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    assert [r["failure_reason"] != "" for r in rows] == [False, True]
    assert smaller_chunks(None, 15) == [7, 3, 1]


def test_early_stop_and_stop_at_score(tmp_path, ckpts):
    loaded = load_model_checkpoint(ckpts[0])
    torch.manual_seed(0)
    a, b = torch.randn(9, 37, 3) * 5, torch.randn(9, 37, 3) * 5
    da, db = torch.cdist(a[:, CA_INDEX], a[:, CA_INDEX]), torch.cdist(b[:, CA_INDEX], b[:, CA_INDEX])
    ref = np.sqrt(((da - db).numpy() ** 2).mean())                  # ColabFold's definition
    assert ca_distance_change(da, db, torch.ones(9)) == pytest.approx(ref, rel=1e-5)
    fasta = _fasta(tmp_path, ("short",))
    runs = {}
    for name, extra in (("full", {}), ("tol", {"recycle_early_stop_tolerance": 1e6}),
                        ("score", {"stop_at_score": 0.0, "num_seeds": 2})):
        r = predict(loaded, fasta, tmp_path / name, progress=False, release_gate="off",
                    config=PredictConfig(**CFG, num_recycles=2, **extra))
        runs[name] = r.rows[0]
    assert runs["full"]["num_recycles"] == 2
    assert runs["tol"]["num_recycles"] == 1                           # stops at the first change
    assert runs["score"]["num_recycles"] == 0 and len(runs["score"]["ensemble"]) == 1
    assert "mean pLDDT" in runs["score"]["ensemble"][0]["early_stop"]["stopped_early"]


def test_folder_and_csv_inputs_single_sequence_and_sorting(tmp_path, ckpts):
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "a.fasta").write_text(f">long\n{SEQS['long']}\n")
    (inp / "b.csv").write_text(f"id,sequence\nshort,{SEQS['short']}\nbad,\n")
    (inp / "c2p90.a3m").write_text(f">c2p90\n{SEQS['mid']}\n>hom1\nMQIFVKTLTGKaTITLD\n"
                                   f">hom2\nMQLFVKTLTGK-ITLE\n")
    res = predict(ckpts[0], inp, tmp_path / "out", progress=False, release_gate="off",
                  config=PredictConfig(**CFG), sort_by_length=True)
    by = {r["target"]: r for r in res.rows}
    assert by["bad"]["route"] == "rejected" and "b.csv:3" in by["bad"]["detail"]
    assert by["c2p90"]["msa_depth"] == 3 and by["short"]["msa_depth"] == 1
    assert [r["target"] for r in res.rows] == ["long", "short", "bad", "c2p90"]   # input order
    prov = json.loads((current_prediction(tmp_path / "out" / "targets" / "c2p90") / "provenance.json").read_text())
    assert prov["inputs"]["msa_files"][0]["path"].endswith("c2p90.a3m")
    single = predict(ckpts[0], inp, tmp_path / "out1", progress=False, release_gate="off",
                     config=PredictConfig(**CFG, msa_mode="single_sequence"))
    assert {r["target"]: r["msa_depth"] for r in single.rows}["c2p90"] == 1


def test_sharding_by_length_squared_and_memory_model():
    lengths = [400, 380, 50, 60, 70, 40, 30, 20]
    shards = shard_by_cost(lengths, 2)
    loads = [sum(lengths[i] ** 2 for i in s) for s in shards]
    rr = [sum(lengths[i] ** 2 for i in range(r, len(lengths), 2)) for r in range(2)]
    assert sorted(i for s in shards for i in s) == list(range(8))
    assert max(loads) / min(loads) < 1.1 < max(rr) / min(rr)
    cfg = build_model(TINY, verbose=False).config
    peaks = [predicted_peak_bytes(cfg, TargetSize(L, 64), None, 10 ** 6) for L in (64, 128, 256)]
    assert peaks[0] < peaks[1] < peaks[2]
    big = TargetSize(512, 256)
    full = predicted_peak_bytes(cfg, big, None, 10 ** 6)
    chunk, need = choose_chunk_size(cfg, big, 10 ** 6, full // 2)
    assert chunk is not None and need <= full // 2


def test_gate_ensemble_disagreement():
    p = np.full(30, 90.0)
    seq = "MKTAYIAKQRQISFVKSHFSRQLEERLGLI"
    pol = GatePolicy(min_msa_depth=1)
    kw = dict(length=30, msa_depth=40, training_crop=None, policy=pol, sequence=seq)
    assert route(p, **kw, ensemble_ca_rmsd=None).route == "accepted"
    assert route(p, **kw, ensemble_ca_rmsd=pol.max_ensemble_ca_rmsd).route == "accepted"
    d = route(p, **kw, ensemble_ca_rmsd=pol.max_ensemble_ca_rmsd + 0.5)
    assert d.route == "needs_review" and d.reasons == ["ensemble_disagreement"]
    with pytest.raises(ValueError, match="max_ensemble_ca_rmsd"):
        GatePolicy(max_ensemble_ca_rmsd=0)


def test_checkpoint_folder_of_models_expands_in_order(tmp_path):
    from protdp.inference.cli import expand_checkpoints
    for name in ("model_2_ptm", "model_10", "model_1", "notes"):
        (tmp_path / name).mkdir()
    single = tmp_path / "one.pt"
    single.write_bytes(b"")
    assert expand_checkpoints([str(tmp_path), str(single)]) == [
        str(tmp_path / "model_1"), str(tmp_path / "model_2_ptm"), str(tmp_path / "model_10"),
        str(single)]


def test_imported_model_numbers_name_the_predictions(tmp_path):
    """A folder holding only AlphaFold's model_3 (as `protdp weights import` writes it) names
    its predictions model_3_seed_*, as AlphaFold does, not model_1; plain checkpoints, and
    numbers two checkpoints would share, fall back to the --checkpoint position."""
    from protdp.inference.ensemble import members
    from protdp.inference.ranking import model_numbers
    assert model_numbers([tmp_path / "w" / "model_3" / "model.pt"]) == [3]
    assert model_numbers([tmp_path / "model_2_ptm", tmp_path / "model_5"]) == [2, 5]
    assert model_numbers([tmp_path / "a.pt", tmp_path / "iter_0000240"]) == [1, 2]
    assert model_numbers([tmp_path / "x" / "model_1", tmp_path / "y" / "model_1"]) == [1, 2]
    assert model_numbers([tmp_path / "model_0"]) == [1]
    names = [m.name for m in members(2, 7, 2, model_numbers([tmp_path / "model_3",
                                                               tmp_path / "model_4"]))]
    assert names == ["model_3_seed_007", "model_3_seed_008", "model_4_seed_007", "model_4_seed_008"]
    assert [m.name for m in members(1, 0, 1)] == ["model_1_seed_000"]


def test_csv_row_over_the_field_limit_is_one_rejected_row(tmp_path):
    """A CSV cell over csv's 128 KiB field limit was a csv.Error traceback that stopped the
    batch; now that row is rejected naming file and line, and the next row is read."""
    from protdp.inference.inputs import read_inputs
    path = tmp_path / "t.csv"
    path.write_text(f"id,sequence\nbig,{'M' * 200_000}\nok,{SEQS['short']}\n")
    targets, _ = read_inputs(path)
    assert [(t.target_id, t.error) for t in targets] == [
        ("", f"{path}:2: unreadable CSV row (field larger than field limit (131072))"),
        ("ok", None)]
    assert targets[1].raw_sequence == SEQS["short"] and targets[1].line == 3


def test_complex_features_folder_given_to_a_monomer_names_the_multimer_checkpoint(tmp_path):
    """The --out folder of `protdp complex features` given to a monomer checkpoint was 'no
    FASTA, a3m or CSV files in the input folder'; now the line says what the folder is and
    that it needs a multimer checkpoint. A folder with neither keeps the old line."""
    from protdp.errors import InputError
    from protdp.inference.inputs import read_inputs
    features = tmp_path / "features"
    (features / "dimer").mkdir(parents=True)
    np.savez(features / "dimer" / "features.npz", aatype=np.zeros(3, np.int32))
    with pytest.raises(InputError) as exc:
        read_inputs(features)
    assert str(features) in str(exc.value)
    assert "complex features" in str(exc.value) and "needs a multimer checkpoint" in str(exc.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no FASTA, a3m or CSV files in the input folder"):
        read_inputs(tmp_path / "empty")


def test_missing_fasta_or_checkpoint_leaves_no_output_folder(tmp_path, capsys):
    """`predict --fasta` or `--checkpoint` with a typo: one line naming it, and no empty --out
    folder made."""
    from protdp.cli import main as protdp_main
    rc = protdp_main(["predict", "--checkpoint", str(tmp_path / "ck"), "--fasta",
                      str(tmp_path / "typo.fasta"), "--out", str(tmp_path / "preds")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"protdp predict: error: {tmp_path / 'typo.fasta'}: file not found"]
    assert not (tmp_path / "preds").exists()
    (tmp_path / "one.fasta").write_text(">a\nMKV\n")                 # and a checkpoint typo
    rc = protdp_main(["predict", "--checkpoint", str(tmp_path / "ck"), "--fasta",
                      str(tmp_path / "one.fasta"), "--out", str(tmp_path / "preds")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"protdp predict: error: {tmp_path / 'ck'}: checkpoint not found"]
    assert not (tmp_path / "preds").exists()
