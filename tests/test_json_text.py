"""The PAE converted once (`protdp.inference.json_text`): every JSON file of a prediction is
byte-identical to the one the old path wrote (each file rounding, listing and encoding the PAE
anew, tests/output_reference.py), each file still reads as its consumer expects it, and the
top model's PAE is rounded once for its pae_<m>.json, the AFDB file and scores.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from output_reference import (finite_or_none, synthetic_preds, synthetic_scores,
                              write_af_files as write_before,
                              write_scores_json as scores_before)
from protdp.inference import af_outputs
from protdp.inference.af_outputs import afdb_pae_name, top_pae_json, write_af_files
from protdp.inference.json_text import JsonMatrix, compact_json, json_plain, strict_json
from protdp.inference.writers import write_json

MAX_PAE = 31.75


def _docs(rng):
    """The same document twice: with JsonMatrix values and with the plain nested lists."""
    a = (rng.random((5, 4)) * 30).astype(np.float32)
    b = rng.random((3, 3)) * 10
    b[1, 2], b[2, 0] = np.nan, -np.inf

    def build(conv):
        return {"name": "ünïcode @json-matrix-0@ \u202e", "pae": conv(a, 1),
                "nested": [{"m": conv(b, 2), "x": [1.5, None, "s"]}, conv(a, 2)],
                "empty": conv(np.zeros((0, 0)), 1), "empty_rows": conv(np.zeros((2, 0)), 1),
                # json's own encoding where a value table would not be exact: -0.0, a wide
                # range; and the table's 0 decimals
                "minus_zero": conv(np.array([[-0.04, 0.04], [2.0, -3.0]]), 1),
                "wide": conv(np.array([[1e9, 0.5], [-1e9, 7.25]]), 2),
                "integers": conv(a * 100, 0),
                "scalar": np.float32(2.5), 3: (1, 2)}
    return (build(JsonMatrix.rounded),
            build(lambda m, d: np.round(np.asarray(m, np.float64), d).tolist()))


@pytest.mark.parametrize("indent", [1, 2, 4])
def test_strict_json_is_json_dumps_byte_for_byte(indent):
    matrices, plain = _docs(np.random.default_rng(indent))
    expected = json.dumps(finite_or_none(plain), indent=indent, ensure_ascii=True,
                          allow_nan=False)
    assert strict_json(matrices, indent=indent) == expected
    assert strict_json(matrices, indent=indent) == expected        # from the cached texts


def test_a_rounded_matrix_is_the_plain_rounded_lists():
    """In memory too: the same Python floats `np.round(...).tolist()` gives, table or not."""
    rng = np.random.default_rng(3)
    for matrix, decimals in ((rng.random((6, 5)) * 31.75, 1), (rng.random((4, 4)) * 31.75, 2),
                             (np.array([[np.nan, -0.04], [1e9, 2.0]]), 1)):
        plain = np.round(matrix.astype(np.float64), decimals).tolist()
        got = JsonMatrix.rounded(matrix, decimals)
        assert json.dumps(got) == json.dumps(plain)           # every value, NaN included
        assert all(type(v) is float for row in got for v in row)
        assert got == plain or np.isnan(matrix).any()        # NaN != NaN


def test_compact_json_is_json_dumps_byte_for_byte():
    matrices, plain = _docs(np.random.default_rng(7))
    for doc in (matrices, plain):                 # what json.dumps itself cannot encode
        doc.pop("scalar")
    assert compact_json(matrices) == json.dumps(plain, separators=(",", ":"))
    assert json.loads(compact_json([matrices]))[0]["nested"][0]["m"][1][2] != 0  # NaN kept


def test_json_plain_is_the_json_round_trip():
    row = {"a": np.float32(1.5), "b": [np.int64(3), float("nan")], "c": np.arange(3),
           "d": (np.inf, "x"), 4: {"e": np.float64(-0.25)}}
    assert json_plain(row) == finite_or_none(row)
    assert json_plain({"p": Path("/x/y"), "t": torch.tensor(2.5)}) == {"p": "/x/y", "t": 2.5}


@pytest.mark.parametrize("case", ["monomer", "nonfinite", "complex"])
def test_prediction_files_are_byte_identical_to_the_old_path(tmp_path, case):
    length = 29
    preds, order, debug = synthetic_preds(length, models=3, seed=len(case),
                                          nonfinite=case == "nonfinite", iptm=case == "complex")
    chains = [("A", "G" * 12), ("B", "A" * 17)] if case == "complex" else None
    seq = "G" * length
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir(), old.mkdir()
    write_af_files(new, "t1", preds, order, debug, {"features": 1.0}, MAX_PAE,
                   save_distogram=False, distogram_edges=None, chains=chains)
    scores = synthetic_scores(preds, order, seq)
    write_json(new / "scores.json", scores)
    write_before(old, "t1", preds, order, debug, {"features": 1.0}, MAX_PAE, chains)
    scores_before(old / "scores.json", scores, preds[order[0]])

    names = sorted(p.name for p in new.iterdir())
    assert names == sorted(p.name for p in old.iterdir())
    for name in names:
        if name.endswith(".npz"):
            with np.load(new / name) as a, np.load(old / name) as b:
                assert a.files == b.files
                for k in a.files:
                    np.testing.assert_array_equal(a[k], b[k])
        elif name == "log.txt":                  # ColabFold's log: lines start with a time
            assert _untimed(new / name) == _untimed(old / name)
        else:
            assert (new / name).read_bytes() == (old / name).read_bytes(), name
    _check_consumers(new, preds, order, chains)


def _untimed(path: Path) -> list[str]:
    return [re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", line)
            for line in path.read_text().splitlines()]


def _check_consumers(folder: Path, preds: dict, order: list, chains):
    """Each file in the form its reader takes: AFDB's list of one object (with `chains` for a
    complex), AlphaFold's pae_<m>.json, ColabFold's scores / PAE keys, scores.json's PAE."""
    top = preds[order[0]]
    one = np.round(top["pae"].astype(np.float64), 1)
    afdb = json.loads((folder / afdb_pae_name("t1")).read_text())
    assert isinstance(afdb, list) and len(afdb) == 1
    assert set(afdb[0]) == {"predicted_aligned_error", "max_predicted_aligned_error"} | (
        {"chains"} if chains else set())
    np.testing.assert_array_equal(np.array(afdb[0]["predicted_aligned_error"], float), one)
    for n in order:
        doc = json.loads((folder / f"pae_{n}.json").read_text())
        np.testing.assert_array_equal(np.array(doc[0]["predicted_aligned_error"], float),
                                      np.round(preds[n]["pae"].astype(np.float64), 1))
    scores = json.loads((folder / f"t1_scores_rank_001_{top['colabfold_tag']}.json").read_text())
    assert {"plddt", "max_pae", "pae", "ptm"} <= set(scores)
    np.testing.assert_array_equal(np.array(scores["pae"], float),
                                  np.round(top["pae"].astype(np.float64), 2))
    v1 = json.loads((folder / "t1_predicted_aligned_error_v1.json").read_text())
    assert v1 == {"predicted_aligned_error": scores["pae"],
                  "max_predicted_aligned_error": scores["max_pae"]}
    ours = json.loads((folder / "scores.json").read_text())
    np.testing.assert_array_equal(np.array(ours["pae"], float), one)


def test_top_model_pae_is_rounded_once(tmp_path, monkeypatch):
    """pae_<top>.json, the AFDB file and scores.json share one conversion (before: three);
    each model's ColabFold scores and the v1 file share another."""
    calls = []
    rounded = JsonMatrix.rounded.__func__

    def counting(cls, matrix, decimals):
        calls.append(decimals)
        return rounded(cls, matrix, decimals)
    monkeypatch.setattr(JsonMatrix, "rounded", classmethod(counting))
    preds, order, debug = synthetic_preds(17, models=3)
    write_af_files(tmp_path, "t1", preds, order, debug, {}, MAX_PAE, save_distogram=False,
                   distogram_edges=None)
    scores = synthetic_scores(preds, order, "G" * 17)
    assert sorted(calls) == [1, 1, 1, 2, 2, 2]      # one of each per model
    top = preds[order[0]]
    assert scores["pae"] is top[af_outputs.TOP_PAE_JSON] is top_pae_json(top)
    assert len(calls) == 6
