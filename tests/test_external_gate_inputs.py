"""`protdp gate` (issue 41 follow-ups): every byte behind a number is read once, parsed from that
read, copied and bound to the review item (AF3 summary confidences, Boltz pLDDT / confidence,
AlphaFold2 confidence and ranking_debug.json, not only the structure and the PAE file); each
JSON is parsed once; OUT folder names are unique (also ignoring case) and deterministic and
never a folder the gate did not make; one `weakest_pair_ipsae`."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import shutil
import sys

import numpy as np
import pytest

from protdp.external.gate import gate_folder
from protdp.gating import GatePolicy
from protdp.paths import REPO_ROOT, data_root
from protdp.review.binding import changed_files
from protdp.review.store import ReviewStore
from protdp.workflows import QueueSink
from test_complex_pairing import FIXTURE

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from interface_cases import build_cases  # noqa: E402

FLAG_ALL = dataclasses.replace(GatePolicy(), min_ipsae=1.0)     # every complex needs review


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return build_cases(tmp_path_factory.mktemp("ext_inputs"), FIXTURE, data_root())


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_case(cases, case: str, dest, rename: dict | None = None):
    """The tool's files of one case (PAE file, structure and their siblings) into `dest`,
    `rename` {old: new} applied once to each file name."""
    pae, _ = cases[case]
    stem = pae.name.split("_full_data")[0].split("_scores_rank")[0]
    stem = stem.removeprefix("pae_").removesuffix(".npz").removeprefix("fold_")
    dest.mkdir(parents=True, exist_ok=True)
    for f in pae.parent.iterdir():
        if stem in f.name:
            name = f.name
            for old, new in (rename or {}).items():
                name = name.replace(old, new, 1)
            shutil.copy(f, dest / name)
    return dest


def _af2_folder(cases, dest, target="good"):
    """An AlphaFold 2.3 folder (ranking_debug.json, ranked_0.pdb, pae_/confidence_<m>.json)."""
    scores_path, pdb = cases["colabfold_fixture_4hhb"]
    cf = json.loads(scores_path.read_text())
    d = dest / target
    d.mkdir(parents=True)
    model = "model_1_multimer_v3_pred_0"
    (d / "ranking_debug.json").write_text(json.dumps({"order": [model, "model_2"]}))
    shutil.copy(pdb, d / "ranked_0.pdb")
    (d / f"confidence_{model}.json").write_text(json.dumps({"confidenceScore": cf["plddt"]}))
    (d / f"pae_{model}.json").write_text(json.dumps([{"predicted_aligned_error": cf["pae"]}]))
    return d


def _gate(src, source, out, queue=None, policy=FLAG_ALL):
    sink = QueueSink(f"sqlite:///{queue}") if queue else None
    try:
        return {r["target"]: r for r in gate_folder(src, source, out, policy, sink)}
    finally:
        if sink:
            sink.close()


# -- 1. every byte that feeds a decision is copied and bound --------------------------------

@pytest.mark.parametrize("source, case, bound", [
    ("alphafold3", "af3_4hhb_haem_tpo", {"cif": "_model_0.cif", "pae": "_full_data_0.json",
                                         "summary": "_summary_confidences_0.json"}),
    ("boltz", "boltz_2q2k_dna", {"cif": "_model_0.cif", "pae": "pae_", "plddt": "plddt_",
                                 "summary": "confidence_"}),
    ("alphafold2", None, {"pdb": "ranked_0.pdb", "pae": "pae_", "plddt": "confidence_",
                          "ranking": "ranking_debug.json"}),
])
def test_every_input_file_is_copied_and_bound(tmp_path, cases, source, case, bound):
    src = tmp_path / "src"
    folder = _af2_folder(cases, src) if case is None else copy_case(cases, case, src)
    out, queue = src / "gated", tmp_path / "q.sqlite"         # OUT inside the tool's folder
    _gate(src, source, out, queue)
    [(target, row)] = _gate(src, source, out, queue).items()  # a rerun: the copies are not inputs
    assert row["status"] == "ok" and row["route"] == "needs_review", row
    originals = {kind: next(p for p in sorted(folder.iterdir()) if p.is_file() and part in p.name)
                 for kind, part in bound.items()}
    made = out / (row.get("folder") or target)
    scores = json.loads((made / "scores.json").read_text())
    store = ReviewStore(str(queue))
    item = store.get(row["review_item"])
    for kind, original in originals.items():
        assert item["file_sha256"][kind] == _sha(original), kind       # the tool's bytes
        assert scores["source"]["sha256"][original.name] == _sha(original)
        assert kind in item["paths"], f"{original.name} is not bound"
        copy = made / item["paths"][kind]
        assert copy.read_bytes() == original.read_bytes()
    assert changed_files(item) == []
    for kind in bound:                       # a change to any bound copy is seen
        copy = made / item["paths"][kind]
        kept = copy.read_bytes()
        copy.write_bytes(kept + b" ")
        assert [p.split(":")[0] for p in changed_files(store.get(item["id"]))] == [kind]
        copy.write_bytes(kept)
    store.close()


def test_a_sibling_rewritten_while_gated_is_an_error_row(tmp_path, cases, monkeypatch):
    """The summary (ipTM) read for the numbers is the one bound: rewritten after it was read,
    the target is an error row naming it, and nothing is written."""
    import protdp.external.gate as gate_mod

    src = copy_case(cases, "af3_4hhb_haem_tpo", tmp_path / "src")
    summary = next(src.glob("*_summary_confidences_0.json"))
    real = gate_mod.read_prediction

    def read_then_rewrite(*args, **kw):
        pred = real(*args, **kw)
        doc = json.loads(summary.read_text())
        summary.write_text(json.dumps({**doc, "iptm": 0.99}))
        return pred
    monkeypatch.setattr(gate_mod, "read_prediction", read_then_rewrite)
    [row] = _gate(src, "alphafold3", tmp_path / "out").values()
    assert row["status"] == "error" and "changed while it was being gated" in row["detail"]
    assert summary.name in row["detail"] and not (tmp_path / "out" / "hb4").exists()


# -- 2. one read, one parse ------------------------------------------------------------------

@pytest.mark.parametrize("source, case, pattern", [
    ("alphafold3", "af3_4hhb_haem_tpo", "*_summary_confidences_0.json"),
    ("colabfold", "colabfold_4hhb", "*_scores_rank_001_*.json"),
])
def test_each_json_is_parsed_once(tmp_path, cases, monkeypatch, source, case, pattern):
    src = copy_case(cases, case, tmp_path / "src")
    path = next(src.glob(pattern))
    data = path.read_bytes()
    real, parsed = json.loads, []

    def counting(s, *a, **kw):
        if s in (data, data.decode()):
            parsed.append(1)
        return real(s, *a, **kw)
    monkeypatch.setattr(json, "loads", counting)
    [row] = _gate(src, source, tmp_path / "out").values()
    assert row["status"] == "ok"
    assert len(parsed) == 1
    scores = real((tmp_path / "out" / row["folder"] / "scores.json").read_text())
    assert scores["iptm"] == real(data)["iptm"] and scores["ptm"] == real(data)["ptm"]


# -- 3. one weakest_pair_ipsae ---------------------------------------------------------------

def test_one_weakest_pair_ipsae():
    from protdp.interface import complex as cx
    from protdp.safety import interface_calibration as ic

    defs = [p for p in (REPO_ROOT / "protdp").rglob("*.py")
            if "def weakest_pair_ipsae" in p.read_text()]
    assert defs == [REPO_ROOT / "protdp" / "interface" / "complex.py"]
    assert ic.weakest_pair_ipsae is cx.weakest_pair_ipsae
    rows = [{"type": "asym", "ipsae": 0.1}, {"type": "max", "ipsae": 0.7},
            {"type": "max", "ipsae": 0.4}]
    assert cx.weakest_pair_ipsae(rows) == 0.4
    assert cx.weakest_pair_ipsae([]) is None and cx.weakest_pair_ipsae(None) is None
    assert cx.weakest_pair_ipsae(["junk", {"type": "asym", "ipsae": 0.2}]) is None
    for bad in (None, True, "0.9", float("nan")):
        assert np.isnan(cx.weakest_pair_ipsae(rows + [{"type": "max", "ipsae": bad}]))


# -- 4. folder names ---------------------------------------------------------------------------

def _colabfold_target(cases, dest, target):
    scores, pdb = cases["colabfold_4hhb"]
    dest.mkdir(parents=True, exist_ok=True)
    for f in (scores, pdb):
        shutil.copy(f, dest / f.name.replace("hb4", target, 1))


def test_folder_names_are_unique_deterministic_and_never_foreign(tmp_path, cases):
    src = tmp_path / "src"
    for sub, target in (("", "a b"), ("", "a_b"), ("", "Hb"), ("", "hb"), ("run2", "hb"),
                        ("", "gate_summary.tsv"), ("", ".."), ("", "mine")):
        _colabfold_target(cases, src / sub, target)
    out = tmp_path / "out"
    (out / "mine").mkdir(parents=True)
    (out / "mine" / "notes.txt").write_text("a user's folder")
    rows = gate_folder(src, "colabfold", out, FLAG_ALL)
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(rows) == 8 and len(ok) == 7
    folders = [r["folder"] for r in ok]
    assert len({f.casefold() for f in folders}) == 7, folders
    for r in ok:
        assert (out / r["folder"]).parent == out
        assert json.loads((out / r["folder"] / "scores.json").read_text())["target"] == r["target"]
    assert (out / "gate_summary.tsv").is_file()
    [mine] = [r for r in rows if r["target"] == "mine"]
    assert mine["status"] == "error" and "refusing to write into it" in mine["detail"]
    assert sorted(p.name for p in (out / "mine").iterdir()) == ["notes.txt"]
    again = gate_folder(src, "colabfold", out, FLAG_ALL)          # a rerun: the same folders
    assert [r["folder"] for r in again] == [r["folder"] for r in rows]
    assert [r["status"] for r in again] == [r["status"] for r in rows]
    with open(out / "gate_summary.tsv", encoding="utf-8") as fh:
        assert sorted(r["folder"] for r in csv.DictReader(fh, delimiter="\t") if r["folder"]) \
            == sorted(folders)
