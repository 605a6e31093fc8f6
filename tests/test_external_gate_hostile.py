"""`protdp gate` on hostile folders (issue 41 follow-up): a link out of the folder, a PAE that
declares 2 GB, a file over the size limit, a FIFO, NaN pLDDT / ipTM, missing siblings and names
that are not plain text. Each is that target's error row (or an honest "unknown"), never a
traceback, a hang, a file from outside copied into the review queue, or gigabytes allocated."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest

from protdp.cli import main as protdp_main
from protdp.external.gate import gate_folder
from protdp.gating import GatePolicy
from protdp.interface.inputs import MAX_INPUT_BYTES
from protdp.paths import REPO_ROOT, data_root
from test_complex_pairing import FIXTURE
from test_external_gate_inputs import copy_case

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from interface_cases import build_cases  # noqa: E402


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return build_cases(tmp_path_factory.mktemp("ext_hostile"), FIXTURE, data_root())


def _rows(src, source, out):
    return {r["target"]: r for r in gate_folder(src, source, out, GatePolicy())}


@pytest.fixture()
def alarm():
    """A hang (a FIFO opened for reading) fails the test instead of stopping the suite."""
    def timeout(*_):
        raise TimeoutError("the gate hung")
    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_links_out_of_the_folder_and_fifos_are_error_rows(tmp_path, cases, alarm):
    src, outside = tmp_path / "src", tmp_path / "elsewhere"
    copy_case(cases, "colabfold_4hhb", outside)
    copy_case(cases, "colabfold_4hhb", src, {"hb4": "inside"})
    (src / "sub").mkdir()
    for f in outside.iterdir():                        # "out": both files link outside
        (src / f.name.replace("hb4", "out", 1)).symlink_to(f)
        shutil.copy(f, src / "sub" / f.name.replace("hb4", "ok", 1))
    for f in (src / "sub").iterdir():                  # "ok": links within the folder
        (src / f.name).symlink_to(f)
    pdb = next(src.glob("inside_unrelaxed_*.pdb"))
    (src / pdb.name.replace("inside", "fifo", 1)).write_bytes(pdb.read_bytes())
    os.mkfifo(src / next(src.glob("inside_scores_*.json")).name.replace("inside", "fifo", 1))
    out = tmp_path / "out"
    rows = _rows(src, "colabfold", out)
    assert rows["inside"]["status"] == rows["ok"]["status"] == "ok"
    assert rows["out"]["status"] == "error" and "outside the folder" in rows["out"]["detail"]
    assert rows["fifo"]["status"] == "error" and "not a regular file" in rows["fifo"]["detail"]
    assert not (out / "out").exists() and not (out / "fifo").exists()


def _npz_declaring(shape, dtype="<f4") -> bytes:
    """An .npz whose pae.npy header declares `shape` but holds 16 bytes of data."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False,
                                                  "shape": tuple(shape)})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pae.npy", header.getvalue() + bytes(16))     # magic + header + data
    return buf.getvalue()


def test_a_declared_2gb_pae_and_an_oversized_file_are_refused_unread(tmp_path, cases):
    src = copy_case(cases, "boltz_2q2k_dna", tmp_path / "boltz")
    pae = next(src.glob("pae_*.npz"))
    pae.write_bytes(_npz_declaring((23170, 23170)))          # 23170² float32 = 2.0 GiB
    big = copy_case(cases, "colabfold_4hhb", tmp_path / "cf")
    scores = next(big.glob("*_scores_rank_*.json"))
    with open(scores, "r+b") as fh:                          # sparse: no disk, no memory
        fh.truncate(MAX_INPUT_BYTES + 1)
    tracemalloc.start()
    try:
        [boltz] = _rows(src, "boltz", tmp_path / "out1").values()
        [cf] = _rows(big, "colabfold", tmp_path / "out2").values()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert boltz["status"] == "error" and "declared 23170x23170" in boltz["detail"]
    assert pae.name in boltz["detail"]
    assert cf["status"] == "error" and "over 512 MiB" in cf["detail"]
    assert peak < 64 * 2**20, peak


def test_nan_and_missing_siblings(tmp_path, cases):
    # NaN pLDDT in a ColabFold scores JSON (json writes NaN as a bare token)
    cf = copy_case(cases, "colabfold_4hhb", tmp_path / "cf")
    scores = next(cf.glob("*_scores_rank_*.json"))
    doc = json.loads(scores.read_text())
    doc["plddt"][3] = float("nan")
    scores.write_text(json.dumps(doc))
    [row] = _rows(cf, "colabfold", tmp_path / "o_cf").values()
    assert row["status"] == "error" and "plddt has non-finite" in row["detail"]
    # Boltz: NaN in plddt npz; NaN in the chain-pair ipTM; no plddt npz at all
    for problem, needle in (("nan_plddt", "plddt has non-finite"),
                            ("nan_pair", "chain-pair ipTM has non-finite"),
                            ("no_plddt", "no per-residue pLDDT")):
        src = copy_case(cases, "boltz_2q2k_dna", tmp_path / problem)
        plddt, conf = next(src.glob("plddt_*.npz")), next(src.glob("confidence_*.json"))
        if problem == "nan_plddt":
            values = np.load(plddt)["plddt"]
            values[2] = np.nan
            np.savez(plddt, plddt=values)
        elif problem == "nan_pair":
            doc = json.loads(conf.read_text())
            doc["pair_chains_iptm"]["0"]["1"] = float("nan")
            conf.write_text(json.dumps(doc))
        else:
            plddt.unlink()
        [row] = _rows(src, "boltz", tmp_path / f"o_{problem}").values()
        assert row["status"] == "error" and needle in row["detail"], (problem, row)
    # AlphaFold 3: NaN ipTM in the summary -> unknown (None, low_iptm); no summary -> the
    # chain-pair ipTM is unknown too (None, not 0.0)
    for problem in ("nan_iptm", "no_summary"):
        src = copy_case(cases, "af3_4hhb_haem_tpo", tmp_path / problem)
        summary = next(src.glob("*_summary_confidences_0.json"))
        if problem == "nan_iptm":
            summary.write_text(json.dumps({**json.loads(summary.read_text()),
                                           "iptm": float("nan")}))
        else:
            summary.unlink()
        out = tmp_path / f"o_{problem}"
        [row] = _rows(src, "alphafold3", out).values()
        s = json.loads((out / row["folder"] / "scores.json").read_text())
        assert row["status"] == "ok" and s["iptm"] is None and "low_iptm" in s["reasons"]
        pair = [v for r in s["chain_pair_iptm"].values() for v in r.values()]
        assert (problem == "no_summary") == all(v is None for v in pair), pair
        assert ("summary" in s["source"]["files"]) == (problem == "nan_iptm")


def test_names_that_are_not_plain_text(tmp_path, cases, capsys):
    src = tmp_path / "src"
    names = ("蛋白", "x\u202ey", "tab\there", os.fsdecode(b"raw\xff\xfe"))
    for name in names:
        copy_case(cases, "colabfold_4hhb", src, {"hb4": name})
    out = tmp_path / "out"
    assert protdp_main(["gate", str(src), "--from", "colabfold", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert "4 targets: 0 accepted, 4 need review" in cap.out
    assert "\u202e" not in cap.out + cap.err and "\t" not in cap.out
    text = (out / "gate_summary.tsv").read_bytes().decode("utf-8")      # valid UTF-8
    rows = list(csv.DictReader(io.StringIO(text), delimiter="\t"))
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert {r["target"] for r in rows} >= {"蛋白", "raw\\\\xff\\\\xfe"}
    for r in rows:
        folder = out / r["folder"]
        assert folder.parent == out and r["folder"].isascii()
        json.loads((folder / "scores.json").read_text())
