"""HDF5 store v2: every PAIRS.tsv pair builds (contract layout, atom37), idempotent rebuilds,
edge cases accounted for in rejects.jsonl, --strict, concurrent lazy readers."""

from __future__ import annotations

import csv
import json
import multiprocessing as mp
import shutil

import h5py
import numpy as np
import pytest

from protdp.data.cli import main as data_main
from protdp.data.residues import sequence_to_ids
from protdp.data.store import FamilyStore, build_store, sha256_file
from protdp.errors import ConfigError, InputError


def _pairs(data_dir):
    with open(data_dir / "PAIRS.tsv") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


@pytest.fixture(scope="module")
def full_store(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("store") / "data.h5"
    report = build_store(out, pairs=data_dir / "PAIRS.tsv", workers=2, progress=False)
    return out, report


def test_every_pair_builds_with_contract_layout(full_store, data_dir):
    out, report = full_store
    rows = _pairs(data_dir)
    assert report.balanced and report.rejected_files == 0 and report.rejected_families == 0
    assert report.accepted_families == len({r["pair_id"] for r in rows}) == 22
    assert report.input_files == len({r["msa_file"] for r in rows} |
                                     {r["structure_file"] for r in rows})
    with h5py.File(out, "r") as h5:
        for r in rows:
            g = h5["families"][r["pair_id"]]
            L = len(g.attrs["sequence"])
            assert g["msa"].dtype == np.uint8 and g["msa"].shape[1] == L
            assert g["deletion_matrix"].dtype == np.uint8
            assert g["deletion_matrix"].shape == g["msa"].shape
            assert g["all_atom_positions"].dtype == np.float32
            assert g["all_atom_positions"].shape == (L, 37, 3)
            assert g["all_atom_mask"].dtype == np.uint8 and g["all_atom_mask"].shape == (L, 37)
            assert g["between_segment_residues"].dtype == np.uint8
            assert g["between_segment_residues"].shape == (L,)
            assert g["residue_index"].dtype == np.int32 and g["residue_index"].shape == (L,)
            assert "backbone_positions" not in g                      # derived on read
            np.testing.assert_array_equal(g["msa"][0], sequence_to_ids(g.attrs["sequence"]))
            assert int(g["all_atom_mask"][:, 1].sum()) == int(r["observed_residues"])
            files = list(g.attrs["source_files"])
            assert r["msa_file"] in files and r["structure_file"] in files
            for f, h in zip(files, g.attrs["source_sha256"]):
                assert h == sha256_file(data_dir / f)
            res = float(g.attrs["resolution"])
            assert np.isnan(res) or 0 < res < 10
            assert g["msa"].chunks is not None and g["msa"].compression == "gzip"
    # 4hhb_B: two MSAs with a terminal difference merged into one 147-column family
        assert h5.attrs["format_version"] == 2
    store = FamilyStore(out)
    fam = store.read("4hhb_B")
    assert fam["msa"].shape[1] == 147 and len(fam["source_files"]) == 3
    assert fam["backbone_positions"].shape == (147, 5, 3) and fam["backbone_mask"].dtype == np.uint8
    assert store.length("2q2k_A") == 70


def test_rebuild_is_idempotent(full_store, data_dir):
    out, _ = full_store
    before = FamilyStore(out).read("2q2k_A")
    report = build_store(out, pairs=data_dir / "PAIRS.tsv", workers=1, progress=False)
    assert report.written == 0 and report.unchanged == 22 and report.balanced
    after = FamilyStore(out).read("2q2k_A")
    for key in ("msa", "deletion_matrix", "all_atom_positions", "all_atom_mask",
                "residue_index", "backbone_positions", "backbone_mask"):
        np.testing.assert_array_equal(before[key], after[key])


def _small_pairs(tmp_path, data_dir, ids, copy=False):
    """PAIRS subset; with copy=True the files are copied so a test may modify them."""
    rows = [r for r in _pairs(data_dir) if r["pair_id"] in ids]
    lines = ["pair_id\tmsa_file\tstructure_file\tchain"]
    for r in rows:
        m, s = data_dir / r["msa_file"], data_dir / r["structure_file"]
        if copy:
            (tmp_path / "in").mkdir(exist_ok=True)
            m = shutil.copy(m, tmp_path / "in" / m.name)
            s = shutil.copy(s, tmp_path / "in" / s.name)
        lines.append(f"{r['pair_id']}\t{m}\t{s}\t{r['chain']}")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_changed_source_is_rebuilt_and_removed_family_dropped(tmp_path, data_dir):
    pairs = _small_pairs(tmp_path, data_dir, {"5awl_A", "7a4d_E"}, copy=True)
    out = tmp_path / "s.h5"
    assert build_store(out, pairs=pairs, progress=False).written == 2
    msa = tmp_path / "in" / "7a4d_E.colabfold.a3m"
    query = msa.read_text().splitlines()[1]
    msa.write_text(msa.read_text() + ">new\n" + "A" + query[1:] + "\n")
    report = build_store(out, pairs=pairs, progress=False)
    assert (report.written, report.unchanged) == (1, 1)
    assert FamilyStore(out).read("7a4d_E")["msa"].shape[0] == 2
    lines = pairs.read_text().splitlines()
    pairs.write_text("\n".join(l for l in lines if not l.startswith("5awl_A")) + "\n")
    report = build_store(out, pairs=pairs, progress=False)
    assert report.removed == 1 and FamilyStore(out).family_ids == ["7a4d_E"]


def test_edge_cases_never_stop_a_build_and_are_all_reported(tmp_path, data_dir):
    edge = data_dir / "edge_cases"
    out = tmp_path / "edge.h5"
    report = build_store(out, msa_dir=edge / "msa", structure_dir=edge / "structures",
                         workers=2, progress=False, config={"allow_single_sequence": True})
    inputs = sorted(str(p) for p in (edge / "msa").iterdir()) + \
        sorted(str(p) for p in (edge / "structures").iterdir())
    assert report.balanced and report.input_files == len(inputs)
    rejects = [json.loads(l) for l in open(tmp_path / "rejects.jsonl")]
    assert all(r["reason"] for r in rejects)
    rejected_files = {r["file"] for r in rejects if r["kind"] == "file"}
    store = FamilyStore(out)
    used = set()
    with h5py.File(out, "r") as h5:
        for fid in store.family_ids:
            used |= {str(edge / f) for f in h5["families"][fid].attrs["source_files"]}
    assert used | rejected_files == set(inputs) and not used & rejected_files
    assert report.accepted_files + report.rejected_files == len(inputs)
    by_file = {r["file"].rsplit("/", 1)[-1]: r for r in rejects if r["kind"] == "file"}
    assert "empty" in by_file["empty.a3m"]["reason"]
    assert by_file["Cys_knot_duplicate_name.sth"]["line"] == 53
    assert "header-only" in by_file["header_only_3efg.pdb"]["reason"]
    assert "ions" in by_file["ions_only.pdb"]["reason"]
    # NMR, altloc, MSE, SEP, CSO, missing-residue entries load as single-sequence families
    for fid in ("1l2y_nmr_38models_A", "1a6m_altlocs_A", "1a8o_mse_A", "1gz2_sep_A",
                "1svy_cso_A", "1dmg_missing_A", "3zee_em_A"):
        assert fid in store.family_ids
    fam = store.read("1dmg_missing_A")
    assert fam["backbone_mask"][:, 1].sum() < fam["msa"].shape[1]
    assert fam["msa"].shape[0] == 1
    # without the flag, a structure without an MSA is a reject, never a silent N_seq = 1
    report = build_store(tmp_path / "strict.h5", msa_dir=edge / "msa",
                         structure_dir=edge / "structures", progress=False)
    assert report.balanced and report.accepted_families == 0
    rejects = [json.loads(l) for l in open(tmp_path / "rejects.jsonl")]
    assert all("--allow-single-sequence" in r["reason"] for r in rejects
               if r["kind"] == "family" and r["rule"] == "msa")


def test_cli_strict_and_report(tmp_path, data_dir, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(data_dir / "edge_cases/msa/empty.a3m", bad / "5awl_A.empty.a3m")
    shutil.copy(data_dir / "structures/5awl.pdb", bad / "5awl.pdb")
    rc = data_main(["build", "--msa-dir", str(bad), "--structure-dir", str(bad),
                    "--out", str(tmp_path / "e.h5"), "--strict", "--no-progress"])
    assert rc == 1 and "inputs 2 = accepted 0 + rejected 2" in capsys.readouterr().out
    pairs = _small_pairs(tmp_path, data_dir, {"5awl_A", "2q2k_A"})
    rc = data_main(["build", "--pairs", str(pairs), "--out", str(tmp_path / "ok.h5"),
                    "--strict", "--no-progress", "--report-json", str(tmp_path / "r.json")])
    assert rc == 0 and json.load(open(tmp_path / "r.json"))["accepted_families"] == 2
    assert data_main(["shards", "--data", str(tmp_path / "ok.h5"), "--world-size", "2"]) == 0
    assert "over 2 rank(s)" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--world-size must be >= 1, got 0"):
        data_main(["shards", "--data", str(tmp_path / "ok.h5"), "--world-size", "0"])


def test_duplicate_chain_and_screening_filters(tmp_path, data_dir):
    pairs = _small_pairs(tmp_path, data_dir, {"2p90_A02", "5awl_A", "2q2k_A"})
    lines = pairs.read_text().splitlines()
    dup = next(l for l in lines if l.startswith("2p90_A02")).replace("2p90_A02\t", "0dup_A\t", 1)
    pairs.write_text("\n".join(lines + [dup]) + "\n")
    concern = tmp_path / "concern.fasta"
    concern.write_text(">concern\nXXXX" + "MGSSHHHHHHSSGLVPGSHMDKKETKHLLK" + "\n")
    report = build_store(tmp_path / "f.h5", pairs=pairs, progress=False,
                         config={"screening_fasta": str(concern)})
    rejects = [json.loads(l) for l in open(tmp_path / "rejects.jsonl")]
    rules = {r["family_id"]: r["rule"] for r in rejects if r["kind"] == "family"}
    assert rules == {"2p90_A02": "duplicate_chain", "2q2k_A": "screening"}
    assert report.rejected_by_rule["duplicate_chain"] == 1
    assert report.rejected_by_rule["screening"] == 1
    assert FamilyStore(tmp_path / "f.h5").family_ids == ["0dup_A", "5awl_A"]
    assert report.balanced


def _read_all(path, ids):
    store = FamilyStore(path)
    return [int(store.read(f)["msa"].sum()) for f in ids]


def test_concurrent_lazy_readers(full_store):
    out, _ = full_store
    store = FamilyStore(out)
    ids = store.family_ids[:6]
    expected = [int(store.read(f)["msa"].sum()) for f in ids]     # parent opens the file first
    with mp.get_context("fork").Pool(2) as pool:
        got = pool.starmap(_read_all, [(out, ids), (out, ids)])
    assert got == [expected, expected]
    with pytest.raises(InputError, match="not in the store"):
        store.read("nope")
    with pytest.raises(InputError, match="not found"):
        FamilyStore(out.parent / "missing.h5")


def test_bad_pairs_and_bad_out_are_clear_errors(tmp_path, data_dir):
    pairs = tmp_path / "p.tsv"
    pairs.write_text("pair_id\tmsa_file\tstructure_file\tchain\n"
                     f"x\t{data_dir}/msa/5awl_A.single_seq.a3m\t{data_dir}/structures/5awl.pdb\tA\n"
                     f"x\t{data_dir}/msa/5awl_A.single_seq.a3m\t{data_dir}/structures/4hhb.pdb\tA\n"
                     f"y\t{data_dir}/msa/5awl_A.single_seq.a3m\t\tA\n")
    report = build_store(tmp_path / "a.h5", pairs=pairs, progress=False)   # bad rows: rejects
    rows = {r["line"]: r for r in map(json.loads, open(tmp_path / "rejects.jsonl"))
            if r["rule"] == "parse"}
    assert "already paired with 5awl.pdb" in rows[3]["reason"]
    assert "empty structure_file" in rows[4]["reason"]
    assert report.accepted_families == 1 and report.rejected_families == 2 and report.balanced
    pairs.write_text("msa\tstructure\n")
    with pytest.raises(InputError, match="needs tab-separated columns"):
        build_store(tmp_path / "a.h5", pairs=pairs, progress=False)
    (tmp_path / "junk.h5").write_text("not hdf5")       # not ours: refused before any work
    with pytest.raises(InputError, match="junk.h5: store already exists and is a text file"):
        build_store(tmp_path / "junk.h5", pairs=data_dir / "PAIRS.tsv", progress=False)


def _cli(argv, capsys):
    from protdp.cli import main as protdp_main
    rc = protdp_main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_output_paths_checked_before_any_work(tmp_path, data_dir, capsys):
    from data_fixtures import permissions_enforced
    pairs = _small_pairs(tmp_path, data_dir, {"5awl_A"})
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    (tmp_path / "a_file").write_text("x")
    cases = [(["--out", str(tmp_path)], "store is a directory"),
             (["--out", str(locked / "s.h5")], "folder is not writable"),
             (["--out", str(tmp_path / "a_file" / "s.h5")], "cannot create the folder"),
             (["--out", str(tmp_path / "s.h5"), "--rejects", str(tmp_path)],
              "rejects report is a directory"),
             (["--out", str(tmp_path / "s.h5"), "--report-json", str(locked / "r.json")],
              "report JSON"),
             (["--out", str(tmp_path / "s.h5"), "--workers", "0"], "--workers")]
    with permissions_enforced():
        for extra, what in cases:
            rc, out, err = _cli(["data", "build", "--pairs", str(pairs), "--no-progress",
                                 *extra], capsys)
            assert rc == 2 and what in err and err.count("\n") == 1, (extra, err)
            assert "Traceback" not in err and not (tmp_path / "s.h5").exists()


def test_verify_and_readers_on_hostile_stores(tmp_path, data_dir, capsys):
    (tmp_path / "junk.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8)
    (tmp_path / "dir.h5").mkdir()
    with h5py.File(tmp_path / "v1.h5", "w") as h5:
        h5.attrs["format_version"] = 1
        h5.create_group("families")
    (tmp_path / "seqs.fasta").write_text(">q\nMKV\n")      # another file given as the store
    cases = {"junk.h5": "cannot open the store: damaged or unreadable; rebuild it with",
             "dir.h5": "a directory, not a store file",
             "missing.h5": "not found", "v1.h5": "rebuild it: protdp data build",
             "seqs.fasta": "cannot open the store: not an HDF5 file"}
    for name, what in cases.items():
        for argv in (["data", "verify", str(tmp_path / name)],
                     ["data", "info", "--data", str(tmp_path / name)],
                     ["data", "shards", "--data", str(tmp_path / name), "--world-size", "2"]):
            rc, out, err = _cli(argv, capsys)
            assert rc == 2 and what in err and err.count("\n") == 1, (argv, err)
            assert name != "seqs.fasta" or "--force" not in err, err   # never advise replacing it


def test_pairs_tsv_is_split_on_tabs_only(tmp_path, capsys):
    """`--pairs`: a cell over csv's 128 KiB field limit was a csv.Error traceback, a stray '"'
    swallowed the rest of the file; an empty file said 'has None'; a row after a blank line
    is named by its file line."""
    from protdp.data.discover import read_pairs
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("msa_file\tstructure_file\tchain\n"
                     f"{'x' * 200_000}.a3m\ts.pdb\tA\n"        # line 2: a huge cell
                     '"q.a3m\tq.pdb\tB\n'                       # line 3: a stray quote
                     "\n"
                     "r.a3m\t\tC\n")                            # line 5: no structure_file
    got = read_pairs(pairs)
    assert [(s.family_id, s.chain, len(s.msa_files)) for s in got.specs] == [
        ("s_A", "A", 1), ("q_B", "B", 1)]
    assert got.specs[1].msa_files[0].endswith('/"q.a3m')
    assert got.bad_rows == [(5, "empty structure_file", None)]
    (tmp_path / "empty.tsv").write_text("")
    rc, _, err = _cli(["data", "build", "--pairs", str(tmp_path / "empty.tsv"), "--out",
                       str(tmp_path / "o.h5")], capsys)
    err = err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].endswith("the file is empty"), err
