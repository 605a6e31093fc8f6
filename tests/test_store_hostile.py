"""Hostile stores (issue 47 D1/D3/D6): a family or complex store whose HDF5 headers declare
huge datasets ((45e6, 37, 3) positions, a (2^31 - 1, L) MSA, an MSA as large as the row bound
in a file of a few hundred KB), a 0-row MSA, a 0-length family, index arrays that disagree,
a string format_version and NaN template coordinates: `data verify` reports each in one line
within seconds, every training read refuses it in one line naming the store, and nothing the
header declares is allocated. The fuzz test inflates random declared sizes and corrupts random
values of a real complex store: each variant verifies and reads back as the original or is
refused in one line. Reference: the untouched store reads and verifies clean."""

from __future__ import annotations

import random
import resource
import shutil
import time

import h5py
import numpy as np
import pytest

from complex_fixtures import GOOD_ROWS, write_manifest
from data_fixtures import build_pairs_store
from protdp.cli import main as protdp_main
from protdp.data.bounds import MAX_COMPRESSION_RATIO, MAX_MSA_ROWS
from protdp.data.store import FamilyStore, verify_store
from protdp.errors import InputError
from protdp.complex.store import ComplexStore, build_complex_store, verify_complex_store
from protdp.paths import REPO_ROOT

KIB = 1024


@pytest.fixture(scope="module")
def family_store(tmp_path_factory, data_dir):
    return build_pairs_store(data_dir, ["2q2k_A"], tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def complex_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("cstore")
    build_complex_store(write_manifest(d / "m.tsv", GOOD_ROWS[4:]), d / "c.h5", log=lambda _: 0)
    return d / "c.h5"


def _declare(g, name, shape, dtype):
    """Replace dataset `name` by an unwritten chunked one of `shape` (a header, no data)."""
    del g[name]
    chunks = tuple(max(1, min(s, 64)) for s in shape) if all(shape) else None
    g.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks,
                     compression="gzip" if chunks else None)


def _family_damage(kind, h5, fid):
    g = h5["families"][fid]
    n, L = int(g.attrs["num_seq"]), int(g.attrs["length"])
    if kind == "positions 45e6":
        _declare(g, "all_atom_positions", (45_000_000, 37, 3), np.float32)
    elif kind in ("msa 2^31-1", "msa at the row bound"):
        rows = 2 ** 31 - 1 if kind == "msa 2^31-1" else MAX_MSA_ROWS
        for name in ("msa", "deletion_matrix"):
            _declare(g, name, (rows, L), np.uint8)
        g.attrs["num_seq"] = rows
        h5["index/num_seq"][0] = min(rows, 2 ** 31 - 1)
    elif kind == "0-row msa":
        for name in ("msa", "deletion_matrix"):
            _declare(g, name, (0, L), np.uint8)
        g.attrs["num_seq"] = 0
        h5["index/num_seq"][0] = 0
    elif kind == "0-length family":
        for name, shape, dt in (("msa", (n, 0), np.uint8), ("deletion_matrix", (n, 0), np.uint8),
                                ("residue_index", (0,), np.int32),
                                ("all_atom_positions", (0, 37, 3), np.float32),
                                ("all_atom_mask", (0, 37), np.uint8),
                                ("between_segment_residues", (0,), np.uint8)):
            _declare(g, name, shape, dt)
        g.attrs["length"] = 0
        h5["index/length"][0] = 0
    elif kind == "index disagrees":
        lengths = h5["index/length"][()]
        del h5["index/length"]
        h5["index/length"] = np.concatenate([lengths, lengths])
    elif kind == "string format_version":
        h5.attrs["format_version"] = "2"
    elif kind == "template NaN":
        t = g.create_group("templates")
        t["aatype"] = np.zeros((1, L), np.int8)
        t["all_atom_positions"] = np.full((1, L, 37, 3), np.nan, np.float32)
        t["all_atom_mask"] = np.ones((1, L, 37), np.uint8)
        t.create_dataset("domain_names", data=np.array(["x_A"], dtype=object),
                         dtype=h5py.string_dtype())


FAMILY_CASES = ["positions 45e6", "msa 2^31-1", "msa at the row bound", "0-row msa",
                "0-length family", "index disagrees", "string format_version", "template NaN"]


@pytest.mark.parametrize("kind", FAMILY_CASES)
def test_hostile_family_store_is_one_line_in_seconds(family_store, tmp_path, kind, capsys):
    path = tmp_path / "s.h5"
    shutil.copy(family_store, path)
    fid = FamilyStore(path).family_ids[0]
    with h5py.File(path, "r+") as h5:
        _family_damage(kind, h5, fid)
    if kind == "msa at the row bound":      # the file-size bound is what refuses it
        assert MAX_MSA_ROWS * 45 > path.stat().st_size * MAX_COMPRESSION_RATIO
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        report = verify_store(path)
        assert not report.ok and all("\n" not in p for p in report.problems), report.problems
    except InputError as exc:               # refused at open (format version)
        assert "\n" not in str(exc) and str(exc).startswith(str(path))
    with pytest.raises(InputError) as exc:
        FamilyStore(path).read(fid)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(str(path)), str(exc.value)
    rc = protdp_main(["data", "verify", str(path)])
    out = capsys.readouterr()
    assert rc in (1, 2) and "Traceback" not in out.err + out.out
    assert time.perf_counter() - t0 < 20, kind
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * KIB, kind


def _complex_damage(kind, h5):
    cid = sorted(h5["complexes"])[0]
    g = h5["complexes"][cid]
    cg = g["0"]
    L = int(cg["msa"].shape[1])
    if kind == "msa 2^31-1":
        for name in ("msa", "deletion_matrix"):
            _declare(cg, name, (2 ** 31 - 1, L), np.uint8)
    elif kind == "positions 45e6":
        _declare(cg, "all_atom_positions", (45_000_000, 37, 3), np.float32)
    elif kind == "0-row msa":
        for name in ("msa", "deletion_matrix"):
            _declare(cg, name, (0, L), np.uint8)
    elif kind == "NaN coordinates":
        pos = cg["all_atom_positions"][()]
        pos[0, 1, 0] = np.nan
        cg["all_atom_positions"][...] = pos
    elif kind == "num_chains 1e9":
        g.attrs["num_chains"] = 10 ** 9
    elif kind == "index disagrees":
        lengths = h5["index/length"][()]
        del h5["index/length"]
        h5["index/length"] = np.concatenate([lengths, lengths])
    return cid


@pytest.mark.parametrize("kind", ["msa 2^31-1", "positions 45e6", "0-row msa", "NaN coordinates",
                                  "num_chains 1e9", "index disagrees"])
def test_hostile_complex_store_is_one_line_in_seconds(complex_store, tmp_path, kind, capsys):
    assert verify_complex_store(complex_store) == []
    path = tmp_path / "c.h5"
    shutil.copy(complex_store, path)
    with h5py.File(path, "r+") as h5:
        cid = _complex_damage(kind, h5)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    problems = verify_complex_store(path)
    assert problems and all("\n" not in p for p in problems), problems
    rc = protdp_main(["data", "verify", str(path)])
    out = capsys.readouterr().out
    assert rc == 1 and "problem(s)" in out and problems[0] in out
    with pytest.raises(InputError) as exc:
        ComplexStore(path).read(cid)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(str(path))
    assert time.perf_counter() - t0 < 20, kind
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * KIB, kind


def test_fuzz_complex_store(complex_store, tmp_path):
    """Random declared-size inflation (a dataset re-declared with one axis x 10^3 .. 10^7) and
    random value corruption (one byte of one array): verify and read either give the original
    arrays or refuse in one line, each case under 20 s and 512 MiB extra peak memory."""
    rng = random.Random(47)
    ref = ComplexStore(complex_store)
    reference = {cid: ref.read(cid) for cid in ref.complex_ids}
    names = ["msa", "deletion_matrix", "residue_index", "all_atom_positions", "all_atom_mask"]
    outcomes = {"same": 0, "refused": 0}
    for k in range(16):
        path = tmp_path / f"f{k}.h5"
        shutil.copy(complex_store, path)
        with h5py.File(path, "r+") as h5:
            cid = rng.choice(sorted(h5["complexes"]))
            cg = h5["complexes"][cid][str(rng.randrange(2))]
            name = rng.choice(names)
            if k % 2:
                shape = list(cg[name].shape)
                shape[rng.randrange(len(shape))] *= 10 ** rng.randint(3, 7)
                _declare(cg, name, tuple(shape), cg[name].dtype)
            else:
                a = cg[name][()]
                a.view(np.uint8).flat[rng.randrange(a.nbytes)] ^= 1 << rng.randrange(8)
                cg[name][...] = a
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        problems = verify_complex_store(path)
        try:
            got = ComplexStore(path).read(cid)
        except InputError as exc:
            assert problems and "\n" not in str(exc) and str(exc).startswith(str(path))
            outcomes["refused"] += 1
        else:
            want = reference[cid]
            same = all(np.array_equal(a[n], b[n], equal_nan=True) for a, b in
                       zip(got["chains"], want["chains"]) for n in names)
            assert same or problems, (k, name)     # a changed value is never silent in verify
            outcomes["same" if same else "refused"] += 1
        assert time.perf_counter() - t0 < 20
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * KIB
    assert outcomes["refused"] >= 8


@pytest.mark.parametrize("kind", ["0-row msa", "msa 2^31-1"])
@pytest.mark.parametrize("workers", ["0", "1"])
def test_train_on_a_hostile_store_is_one_line(data_dir, tmp_path, kind, workers, capsys):
    """A family the store refuses never silently drops out of training (main: IndexError /
    RuntimeError, or an ArrayMemoryError traceback). The ordered feed (--data-workers 0) stops
    with one line naming the store and the family; the tolerant feed (issue 44) sets it aside,
    replaces it and records it in RUN_DIR/quarantine.jsonl (reason 'error', naming it)."""
    from protdp.data.pipeline.quarantine import QUARANTINE_FILE, read_quarantine

    path = build_pairs_store(data_dir, ["2q2k_A", "5awl_A"], tmp_path)
    fid = FamilyStore(path).family_ids[0]
    with h5py.File(path, "r+") as h5:
        _family_damage(kind, h5, fid)
    rc = protdp_main(["train", "--config", str(REPO_ROOT / "configs/train/tiny.yaml"), "--data",
                      str(path), "--data-workers", workers,
                      "--global-batch-size", "1", "--train-iters", "2", "--eval-iters", "0",
                      "--val-fraction", "0", "--log-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    if workers == "0":
        assert rc == 2 and f"family '{fid}'" in err, err[-2000:]
        return
    assert rc == 0, err[-2000:]
    records = read_quarantine(tmp_path / "run" / QUARANTINE_FILE)
    assert records and {r["family"] for r in records} == {fid}, records
    assert all(r["reason"] == "error" and fid in r.get("detail", "") for r in records), records
