"""Hostile inputs (issue 17): generated corrupt variants of real corpus files (truncation at
random offsets, binary garbage, encodings, wrong columns, NaN / absurd coordinates, short lines),
permission-denied files, directories and FIFOs. Every read either gives exactly the original
data (format variants: gzip, BOM, CRLF, CR) or one clean line naming the file; nothing wrong is
stored; a batch of any mix finishes, keeps every good item and records every bad one."""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_fixtures import assert_clean_message, permissions_enforced
from protdp.data.atoms import COORD_LIMIT
from protdp.data.parse import parse_msa, parse_structure
from protdp.data.store import FamilyStore, build_store
from protdp.errors import InputError

RNG_SEED = 1234


def _read(path, *, structure=False, chain="A"):
    """(result, None) or (None, message) — anything but an InputError fails the test."""
    try:
        return (parse_structure(path, chain) if structure else parse_msa(path)), None
    except InputError as exc:
        assert_clean_message(str(exc), path)
        return None, str(exc)


def _same_msa(a, b):
    assert a.sequences == b.sequences and a.names == b.names
    np.testing.assert_array_equal(a.deletion_matrix, b.deletion_matrix)


def _same_chain(a, b):
    assert a.sequence == b.sequence and a.author_ids == b.author_ids
    np.testing.assert_array_equal(a.all_atom_mask, b.all_atom_mask)
    np.testing.assert_array_equal(a.all_atom_positions, b.all_atom_positions)


def _atoms_subset(part, full):
    """Every atom `part` holds, `full` holds at the same author residue with the same xyz."""
    where = {a: i for i, a in enumerate(full.author_ids) if a}
    for i, a in enumerate(part.author_ids):
        if not a:
            continue
        j = where[a]
        m = part.all_atom_mask[i]
        assert (full.all_atom_mask[j] >= m).all()
        np.testing.assert_array_equal(part.all_atom_positions[i][m],
                                      full.all_atom_positions[j][m])


# ----------------------------------------------------------------------------- MSA files

MSA_SOURCES = ("msa/2q2k_A.bfd_uniclust.a3m", "msa/2q2k_A.uniref90.sto",
               "edge_cases/msa/hedgehog.aln", "msa/T1042.hhblits.a3m")


def _format_variants(raw: bytes, name: str) -> dict[str, bytes]:
    """Same content, other encodings of it: each must read exactly like the original."""
    return {f"crlf_{name}": raw.replace(b"\n", b"\r\n"), f"cr_{name}": raw.replace(b"\n", b"\r"),
            f"bom_{name}": b"\xef\xbb\xbf" + raw, f"{name}.gz": gzip.compress(raw),
            f"two_members_{name}.gz": gzip.compress(raw[:40]) + gzip.compress(raw[40:])}


def _broken_variants(raw: bytes, name: str, rng) -> dict[str, bytes]:
    """Damaged content: each must be a clean one-line error (or, for truncation, data that is
    a prefix of the original)."""
    mid = len(raw) // 2
    out = {f"nul_{name}": raw[:mid] + b"\x00" + raw[mid:],
           f"latin1_{name}": raw[:mid] + b"\xe9" + raw[mid:],
           f"utf16_{name}": raw.decode().encode("utf-16"),
           f"garbage_{name}": bytes(rng.integers(0, 256, 3000, dtype=np.uint8)),
           f"empty_{name}": b"",
           f"gz_truncated_{name}.gz": gzip.compress(raw)[:-20],
           f"gz_garbage_{name}.gz": b"\x1f\x8b" + bytes(rng.integers(0, 256, 500, np.uint8)),
           f"not_gzip_{name}.gz": raw}
    for k, off in enumerate(sorted(rng.integers(1, len(raw) - 1, 6))):
        out[f"truncated{k}_{name}"] = raw[:off]
    return out


def test_msa_variants_read_identically_or_fail_cleanly(tmp_path, data_dir):
    rng = np.random.default_rng(RNG_SEED)
    n_checked = 0
    for rel in MSA_SOURCES:
        src = data_dir / rel
        raw = src.read_bytes()
        original = parse_msa(src)
        for name, data in _format_variants(raw, src.name).items():
            path = tmp_path / name
            path.write_bytes(data)
            got, err = _read(path)
            assert err is None, err
            _same_msa(got, original)
            n_checked += 1
        for name, data in _broken_variants(raw, src.name, rng).items():
            path = tmp_path / name
            path.write_bytes(data)
            got, err = _read(path)
            n_checked += 1
            if got is None:
                continue
            # a cut at a record / block boundary (or inside a lone query line, which no reader
            # can tell from a file without final newline) reads as fewer rows or columns
            assert name.startswith("truncated"), (name, "damaged file was accepted")
            assert original.query.startswith(got.query) and got.depth <= original.depth
    assert n_checked >= 60


def test_msa_content_errors_name_file_and_line(tmp_path, data_dir):
    cases = {
        "rows.a3m": (">q\nACDEF\n>r\nACDEFG\n", "line 4|:4:", "aligned columns"),
        "allx.a3m": (">q\nXXXXXX\n>r\nACDEFG\n", ":2:", "all X"),
        "gr.sto": ("# STOCKHOLM 1.0\nq1 ACDEFGHIK\n#=GR q1 SS CCCHH\ns2 ACDEFGHIK\n//\n",
                   ":3:", "#=GR q1 SS annotation has 5 columns"),
        "gc.sto": ("# STOCKHOLM 1.0\nq1 ACDEFGHIK\ns2 ACDEFGHIK\n#=GC SS_cons CCC\n//\n",
                   ":4:", "#=GC SS_cons"),
        "short.sto": ("# STOCKHOLM 1.0\nq1 ACDEFGHIK\ns2 ACDEF\n//\n", ":3:", "row 's2' has 5"),
        "bad.aln": ("CLUSTAL W\n\nq1 ACDEF\ns2 ACD\n", ":4:", "row 's2' has 3 columns"),
        "head.aln": ("CLUSTAL W (1.83)\n\n\n", "", "no sequence rows after the Clustal header"),
        "psicov.aln": ("ACDEF\nAC?EF\n", ":2:", "PSICOV"),
        "sto_as.a3m": ("# STOCKHOLM 1.0\nq ACD\n//\n", ":1:", "Stockholm"),
    }
    for name, (text, where, what) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(InputError) as err:
            parse_msa(path)
        msg = str(err.value)
        assert_clean_message(msg, path)
        assert what in msg, msg
        assert not where or any(w in msg for w in where.split("|")), msg


def test_clustal_headers_of_other_aligners(tmp_path, data_dir):
    """MUSCLE and Kalign write Clustal with their own header; Biopython reads them all."""
    from Bio import AlignIO
    body = (data_dir / "edge_cases/msa/hedgehog.aln").read_text().split("\n", 1)[1]
    ref = parse_msa(data_dir / "edge_cases/msa/hedgehog.aln")
    for header in ("MUSCLE (3.8) multiple sequence alignment", "Kalign (2.0) alignment in "
                   "ClustalW format", "CLUSTALW 2.1", "CLUSTAL O(1.2.4) multiple sequence "
                   "alignment"):
        for ext in (".aln", ".clustal", ".clw"):
            path = tmp_path / f"x{ext}"
            path.write_text(header + "\n" + body)
            got = parse_msa(path)
            _same_msa(got, ref)
    bio = AlignIO.read(str(data_dir / "edge_cases/msa/hedgehog.aln"), "clustal")
    assert str(bio[0].seq).replace("-", "") == ref.query


@pytest.mark.timeout(60)
def test_special_files_are_refused_without_blocking(tmp_path, data_dir):
    """FIFOs (would block forever), directories, loops, missing and unreadable files."""
    fifo = tmp_path / "pipe.a3m"
    os.mkfifo(fifo)
    os.mkfifo(tmp_path / "pipe.pdb")
    (tmp_path / "dir.a3m").mkdir()
    (tmp_path / "dir.cif").mkdir()
    loop = tmp_path / "loop.a3m"
    loop.symlink_to(loop)
    for name, src in (("locked.a3m", "msa/5awl_A.single_seq.a3m"),
                      ("locked.pdb", "structures/5awl.pdb")):
        shutil.copy(data_dir / src, tmp_path / name)
        (tmp_path / name).chmod(0)
    expect = {"pipe.a3m": "named pipe", "pipe.pdb": "named pipe", "dir.a3m": "directory",
              "dir.cif": "directory", "loop.a3m": "symbolic links",
              "missing.a3m": "file not found", "locked.a3m": "permission denied",
              "locked.pdb": "permission denied"}
    with permissions_enforced():
        for name, what in expect.items():
            path = tmp_path / name
            read = parse_msa if name.endswith(".a3m") else parse_structure
            with pytest.raises(InputError, match=what) as err:
                read(path)
            assert_clean_message(str(err.value), path)


# ------------------------------------------------------------------------ structure files

def _coordinate_lines(text):
    return [i for i, l in enumerate(text.split("\n")) if l.startswith("ATOM")]


def test_bad_coordinates_are_dropped_with_a_warning(tmp_path, data_dir):
    src = data_dir / "edge_cases/structures/1a8o_mse.pdb"
    text = src.read_text()
    full = parse_structure(src, "A")
    lines = text.split("\n")
    atom_lines = _coordinate_lines(text)
    for k, (kind, new) in enumerate([("nan", "     nan"), ("inf", "    -inf"),
                                     ("huge", "    1e30"), ("word", "  12.x45"),
                                     ("cut", None)]):
        i = atom_lines[10 + 7 * k]
        bad = list(lines)
        bad[i] = bad[i][:46] if new is None else bad[i][:30] + new + bad[i][38:]
        path = tmp_path / f"{kind}.pdb"
        path.write_text("\n".join(bad))
        chain = parse_structure(path, "A")
        assert chain.dropped_atoms == 1 and f"{path.name}:{i + 1}:" in chain.warnings[0]
        assert np.isfinite(chain.all_atom_positions).all()
        assert (np.abs(chain.all_atom_positions) <= COORD_LIMIT).all()
        _atoms_subset(chain, full)
        assert chain.all_atom_mask.sum() == full.all_atom_mask.sum() - 1
    cif = (data_dir / "structures/2q2k.cif").read_text()
    rows = [l for l in cif.split("\n") if l.startswith("ATOM")]
    fields = rows[5].split()
    fields[10] = "nan"                                     # Cartn_x of one atom
    path = tmp_path / "nan.cif"
    path.write_text(cif.replace(rows[5], " ".join(fields)))
    chain = parse_structure(path, "A")
    assert chain.dropped_atoms == 1 and "not finite" in chain.warnings[0]
    _atoms_subset(chain, parse_structure(data_dir / "structures/2q2k.cif", "A"))


STRUCTURE_SOURCES = (("structures/5awl.pdb", "A"), ("edge_cases/structures/1a8o_mse.pdb", "A"),
                     ("structures/2q2k.cif", "A"), ("edge_cases/structures/4zey_mse.cif", "A"))


def test_structure_variants_read_identically_or_fail_cleanly(tmp_path, data_dir):
    rng = np.random.default_rng(RNG_SEED)
    for rel, chain_id in STRUCTURE_SOURCES:
        src = data_dir / rel
        raw = src.read_bytes()
        full = parse_structure(src, chain_id)
        for name, data in _format_variants(raw, src.name).items():
            path = tmp_path / name
            path.write_bytes(data)
            got, err = _read(path, structure=True, chain=chain_id)
            assert err is None, err
            _same_chain(got, full)
        for name, data in _broken_variants(raw, src.name, rng).items():
            path = tmp_path / name
            path.write_bytes(data)
            got, err = _read(path, structure=True, chain=chain_id)
            if got is not None:        # only a cut exactly at a line end may still be read
                assert name.startswith("truncated"), (name, "damaged file was accepted")
                _atoms_subset(got, full)
        # every 1/40 of the file as a truncation point: never a wrong coordinate stored
        lines = raw.split(b"\n")
        cuts = list(np.linspace(len(raw) * 0.05, len(raw) - 1, 40).astype(int))
        cuts.append(len(b"\n".join(lines[:len(lines) * 2 // 3])) + 1)      # at a line end
        for off in cuts:
            path = tmp_path / f"cut{off}_{src.name}"
            path.write_bytes(raw[:off])
            got, err = _read(path, structure=True, chain=chain_id)
            if got is not None:
                _atoms_subset(got, full)
                if raw.startswith(b"HEADER") and got.all_atom_mask.sum() < full.all_atom_mask.sum():
                    assert any("may be truncated" in w for w in got.warnings)
            elif raw[off - 1:off] != b"\n":
                assert "truncated" in err or "chain" in err or "no " in err, err


def _without_cif_column(text: str, column: str) -> str:
    """mmCIF text with one _atom_site column (header line and value in every row) removed."""
    lines = text.split("\n")
    heads = [i for i, l in enumerate(lines) if l.startswith("_atom_site.")]
    k = next(j for j, i in enumerate(heads) if lines[i].split()[0] == f"_atom_site.{column}")
    out = []
    for i, line in enumerate(lines):
        if i == heads[k]:
            continue
        if i > heads[-1] and line.startswith(("ATOM", "HETATM")):
            parts = line.split()
            line = " ".join(parts[:k] + parts[k + 1:])
        out.append(line)
    return "\n".join(out)


def test_mmcif_missing_columns(tmp_path, data_dir):
    """Optional columns (incl. _atom_site.id, whose absence was a raw KeyError) are filled with
    their mmCIF meaning; a missing coordinate column is one clear line."""
    src = data_dir / "structures/2q2k.cif"
    full = parse_structure(src, "A")
    for column, ok in (("id", True), ("occupancy", True), ("B_iso_or_equiv", True),
                       ("pdbx_PDB_model_num", True), ("label_alt_id", True),
                       ("pdbx_PDB_ins_code", True), ("Cartn_x", False),
                       ("auth_seq_id", True), ("label_comp_id", True)):
        path = tmp_path / f"no_{column}.cif"
        path.write_text(_without_cif_column(src.read_text(), column))
        got, err = _read(path, structure=True)
        if ok:
            assert err is None, (column, err)
            assert np.array_equal(got.observed, full.observed), column
        else:
            assert f"no _atom_site.{column} column" in err


# ---------------------------------------------------------------------- batch accounting

GOOD = ("5awl_A", "7a4d_E", "2p90_A02", "2q2k_A")


def _rows(data_dir):
    return [r for r in csv.DictReader(open(data_dir / "PAIRS.tsv"), delimiter="\t")
            if r["pair_id"] in GOOD and r["msa_file"] != "msa/2p90_A02.hhblits.a3m"]


def _bad_item(kind: str, folder, data_dir, k: int):
    """(msa path, structure path, chain) of one bad family of `kind` (real 2P90 otherwise)."""
    msa = data_dir / "msa/2p90_A02.hhblits_subsample.a3m"
    pdb = data_dir / "structures/2p90_A02.pdb"
    m, s = folder / f"bad{k}.a3m", folder / f"bad{k}.pdb"
    shutil.copy(pdb, s)
    if kind == "fifo_msa":
        os.mkfifo(m)
    elif kind == "dir_structure":
        shutil.copy(msa, m)
        s.unlink()
        s.mkdir()
    elif kind == "garbage_msa":
        m.write_bytes(bytes(range(256)) * 4)
    elif kind == "gr_sto":
        m = folder / f"bad{k}.sto"
        m.write_text("# STOCKHOLM 1.0\nq1 ACDEFGHIK\n#=GR q1 SS CCCHH\n//\n")
    elif kind == "truncated_structure":
        shutil.copy(msa, m)
        s.write_bytes(pdb.read_bytes()[:1500])
    elif kind == "unrelated":
        m = data_dir / "msa/5awl_A.single_seq.a3m"
    elif kind == "allx":
        m.write_text(">q\n" + "X" * 45 + "\n")
    elif kind == "locked_msa":
        shutil.copy(msa, m)
        m.chmod(0)
    return m, s, "A"


BAD_KINDS = ("fifo_msa", "dir_structure", "missing_msa", "garbage_msa", "gr_sto",
             "truncated_structure", "unrelated", "allx", "locked_msa")


def _write_pairs(path, rows):
    path.write_text("pair_id\tmsa_file\tstructure_file\tchain\n" +
                    "".join("\t".join(map(str, r)) + "\n" for r in rows))


def _mixed_batch(tmp_path, data_dir, good_ids, bad_kinds, workers):
    folder = tmp_path / "inputs"
    folder.mkdir()
    rows = [(r["pair_id"], data_dir / r["msa_file"], data_dir / r["structure_file"],
             r["chain"]) for r in _rows(data_dir) if r["pair_id"] in good_ids]
    bad = {}
    for k, kind in enumerate(bad_kinds):
        m, s, c = _bad_item(kind, folder, data_dir, k)
        bad[f"zbad{k}_{kind}"] = (m, s)
        rows.append((f"zbad{k}_{kind}", m, s, c))
    _write_pairs(tmp_path / "pairs.tsv", rows)
    with permissions_enforced():
        report = build_store(tmp_path / "out" / "data.h5", pairs=tmp_path / "pairs.tsv",
                             workers=workers, progress=False)
    rejects = [json.loads(l) for l in open(tmp_path / "out" / "rejects.jsonl")]
    return report, rejects, bad


@pytest.fixture(scope="module")
def good_reference(tmp_path_factory, data_dir):
    """Content hash of every good family, built alone."""
    tmp = tmp_path_factory.mktemp("good")
    rows = [(r["pair_id"], data_dir / r["msa_file"], data_dir / r["structure_file"],
             r["chain"]) for r in _rows(data_dir)]
    _write_pairs(tmp / "pairs.tsv", rows)
    build_store(tmp / "data.h5", pairs=tmp / "pairs.tsv", progress=False)
    store = FamilyStore(tmp / "data.h5")
    return {f: store.read(f)["content_sha256"] for f in store.family_ids}


def _check_batch(report, rejects, bad, good_ids, reference, out):
    assert report.balanced
    store = FamilyStore(out)
    assert sorted(store.family_ids) == sorted(good_ids)         # every good one, nothing else
    for fid in good_ids:
        assert store.read(fid)["content_sha256"] == reference[fid]
    for fid, (m, s) in bad.items():                             # every bad one, with a reason
        mine = [r for r in rejects if r["family_id"] == fid or r["file"] in (str(m), str(s))]
        assert any(r["kind"] == "family" for r in mine), fid
        for r in mine:
            assert r["reason"] and not r["reason"].startswith("Traceback")
            assert_clean_message(f"{r['file']}: {r['reason']}", str(r["file"]))


@pytest.mark.timeout(300)
def test_mixed_batch_keeps_every_good_and_records_every_bad(tmp_path, data_dir,
                                                            good_reference):
    report, rejects, bad = _mixed_batch(tmp_path, data_dir, GOOD, BAD_KINDS, workers=2)
    _check_batch(report, rejects, bad, GOOD, good_reference, tmp_path / "out" / "data.h5")
    reasons = {fid: " ".join(r["reason"] for r in rejects if r["family_id"] == fid or
                             r["file"] in map(str, bad[fid])) for fid in bad}
    expect = {"fifo_msa": "named pipe", "dir_structure": "directory",
              "missing_msa": "file not found", "garbage_msa": "binary data",
              "gr_sto": "#=GR q1 SS annotation", "truncated_structure": "truncated",
              "unrelated": "min_pairing_coverage|no observed structure residue aligns",
              "allx": "all X", "locked_msa": "permission denied"}
    for fid, text in reasons.items():
        assert re.search(expect[fid.split("_", 1)[1]], text), (fid, text)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(good=st.sets(st.sampled_from(GOOD), min_size=0, max_size=len(GOOD)),
       bad=st.lists(st.sampled_from(BAD_KINDS), min_size=0, max_size=5))
@pytest.mark.timeout(600)
def test_any_mix_accounts_for_every_input(tmp_path_factory, data_dir, good_reference, good,
                                          bad):
    tmp = tmp_path_factory.mktemp("mix")
    report, rejects, bad_items = _mixed_batch(tmp, data_dir, good, bad, workers=1)
    _check_batch(report, rejects, bad_items, good, good_reference, tmp / "out" / "data.h5")
    files = {str(p) for r in _rows(data_dir) if r["pair_id"] in good
             for p in (data_dir / r["msa_file"], data_dir / r["structure_file"])}
    assert report.input_files >= len(files)


def test_discovery_counts_every_file_it_sees(tmp_path, data_dir):
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(data_dir / "msa/5awl_A.single_seq.a3m", d / "5awl_A.single_seq.a3m")
    (d / "5awl.pdb.gz").write_bytes(gzip.compress((data_dir / "structures/5awl.pdb")
                                                  .read_bytes()))
    (d / "7a4d_E.colabfold.a3m.gz").write_bytes(gzip.compress(
        (data_dir / "msa/7a4d_E.colabfold.a3m").read_bytes()))
    shutil.copy(data_dir / "structures/7a4d-assembly1.cif", d / "7a4d-assembly1.cif")
    (d / "README.txt").write_text("notes")
    (d / ".hidden.a3m").write_text(">q\nACDE\n")
    (d / "sub").mkdir()
    os.mkfifo(d / "pipe.a3m")
    (d / "dangling.pdb").symlink_to(d / "nowhere.pdb")
    report = build_store(tmp_path / "s.h5", msa_dir=d, structure_dir=d, progress=False)
    assert sorted(FamilyStore(tmp_path / "s.h5").family_ids) == ["5awl_A", "7a4d_E"]
    rejects = [json.loads(l) for l in open(tmp_path / "rejects.jsonl")]
    skipped = {os.path.basename(r["file"]): r["reason"] for r in rejects
               if r["kind"] == "skipped"}
    assert set(skipped) == {"README.txt", ".hidden.a3m", "sub", "pipe.a3m", "dangling.pdb"}
    assert "unknown extension '.txt'" in skipped["README.txt"]
    assert "named pipe" in skipped["pipe.a3m"] and "directory" in skipped["sub"]
    assert report.input_files == 9 == report.accepted_files + report.skipped_files
    assert report.balanced


# ---------------------------------------------------------------- predict: per target

@pytest.mark.timeout(600)
def test_predict_rejects_bad_msas_and_finishes_the_batch(tmp_path, data_dir):
    """`protdp predict` with one good MSA and MSAs that are a FIFO, permission-denied, not
    UTF-8, crash Biopython (#=GR shorter than the alignment) or gzip-compressed; the FASTA has
    CR-only line endings. Every target gets its row, the bad ones rejected with the file named,
    and summary.tsv is written."""
    import torch
    from protdp.inference.checkpoint import save_model_checkpoint
    from protdp.inference.predictor import PredictConfig
    from protdp.model import build_model
    from protdp.paths import REPO_ROOT
    from protdp.workflows import predict

    torch.manual_seed(0)
    ckpt = save_model_checkpoint(build_model(REPO_ROOT / "configs/model/tiny.yaml",
                                             verbose=False), None, tmp_path / "tiny.pt",
                                 training_crop=32, max_msa_rows=16)
    src = data_dir / "msa/2p90_A02.hhblits_subsample.a3m"
    seq = parse_msa(src).query
    msa = tmp_path / "msa"
    msa.mkdir()
    shutil.copy(src, msa / "good.a3m")
    (msa / "zipped.a3m.gz").write_bytes(gzip.compress(src.read_bytes()))
    os.mkfifo(msa / "fifo.a3m")
    shutil.copy(src, msa / "locked.a3m")
    (msa / "locked.a3m").chmod(0)
    (msa / "latin1.a3m").write_bytes(b">q caf\xe9\n" + seq.encode() + b"\n")
    (msa / "grshort.sto").write_text(f"# STOCKHOLM 1.0\nq {seq}\n#=GR q SS CCC\n//\n")
    names = ["good", "zipped", "fifo", "locked", "latin1", "grshort"]
    fasta = tmp_path / "t.fasta"
    fasta.write_bytes("".join(f">{n}\r{seq}\r" for n in names).encode())
    with permissions_enforced():
        result = predict(ckpt, fasta, tmp_path / "out", msa_dir=msa, progress=False, release_gate="off",
                         config=PredictConfig(max_length=120, max_msa_rows=16))
    rows = {r["target"]: r for r in result.rows}
    assert list(rows) == names and result.summary_path.is_file()
    for ok in ("good", "zipped"):
        assert rows[ok]["status"] != "rejected" and rows[ok]["msa_depth"] > 1, rows[ok]
    expect = {"fifo": "named pipe", "locked": "permission denied", "latin1": "not a text file in UTF-8",
              "grshort": "#=GR q SS annotation has 3 columns"}
    for name, what in expect.items():
        row = rows[name]
        assert row["status"] == "rejected" and what in row["detail"], row
        path = next(p for p in msa.iterdir() if p.name.startswith(name))
        assert_clean_message(row["detail"], path)


def test_build_report_counts_dropped_atoms_and_warnings(tmp_path, data_dir):
    lines = (data_dir / "structures/2p90_A02.pdb").read_text().split("\n")
    i = next(k for k, l in enumerate(lines) if l.startswith("ATOM") and l[12:16] == " CB ")
    lines[i] = lines[i][:30] + "     nan" + lines[i][38:]
    (tmp_path / "2p90_nan.pdb").write_text("\n".join(lines))
    _write_pairs(tmp_path / "p.tsv", [("2p90_A02", data_dir / "msa/2p90_A02.hhblits_subsample.a3m",
                                       tmp_path / "2p90_nan.pdb", "A")])
    report = build_store(tmp_path / "s.h5", pairs=tmp_path / "p.tsv", progress=False)
    assert report.dropped_atoms == 1 and report.families_with_warnings == 1
    assert "1 invalid atom records dropped" in report.summary()
    fam = FamilyStore(tmp_path / "s.h5").read("2p90_A02")
    assert f"2p90_nan.pdb:{i + 1}: atom dropped: coordinate nan" in fam["warnings"]
    report = build_store(tmp_path / "s.h5", pairs=tmp_path / "p.tsv", progress=False)
    assert report.unchanged == 1 and report.dropped_atoms == 1      # kept across rebuilds


def test_writable_folder_helper(tmp_path):
    """The check `protdp predict --out` needs before any work (one line, never a traceback)."""
    from protdp.data.safeio import writable_folder
    (tmp_path / "file").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    assert writable_folder(tmp_path / "new" / "deep", "output folder") == tmp_path / "new/deep"
    with permissions_enforced():
        for path, what in ((tmp_path / "file", "is not a folder"),
                           (tmp_path / "file" / "sub", "cannot create"),
                           (locked, "not writable"), (locked / "sub", "cannot create")):
            with pytest.raises(InputError, match=what) as err:
                writable_folder(path, "output folder")
            assert "\n" not in str(err.value)
