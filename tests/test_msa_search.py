"""`protdp msa search` against HMMER's own jackhmmer and on real families with decoys.

The database is real family members from ../shared/data MSAs, their shuffled decoys and a real
bacterial proteome (tests/msa_fixtures.py). The reference is the `jackhmmer` binary (Debian
package `hmmer`, installed by .ci/run) with the same settings (AF2's flags); the hit sets and
their order must agree exactly, domain coordinates included (row names are `target/from-to`).
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from msa_fixtures import (FAMILIES, GLOBINS, family_records, msa_sequences, run_jackhmmer,
                          stockholm_names, write_fasta)
from protdp.cli import main as protdp_main
from protdp.data.parse import parse_msa
from protdp.errors import InputError
from protdp.msa import Query, SearchSettings, SequenceDatabase, search_database, search_targets
from protdp.msa.writers import alignment_to_a3m


@pytest.fixture(scope="module")
def family_db(tmp_path_factory, data_dir):
    """The same records as FASTA (for jackhmmer) and FASTA.gz (streamed by protdp)."""
    folder = tmp_path_factory.mktemp("msa_db")
    records = family_records(data_dir)
    return {"fasta": write_fasta(folder / "families.fasta", records),
            "gz": write_fasta(folder / "families.fasta.gz", records),
            "members": {fam: msa_sequences(data_dir / rel) for fam, rel in FAMILIES.items()}}


def _queries(family_db, names=tuple(FAMILIES)):
    return [Query(f"{fam} query", fam, family_db["members"][fam][0]) for fam in names]


def _row_names(msa) -> list[str]:
    return [n.decode() if isinstance(n, bytes) else n for n in msa.names]


@pytest.mark.parametrize("iterations", [1, 3])
def test_hits_identical_to_hmmer_jackhmmer(family_db, tmp_path, iterations):
    assert shutil.which("jackhmmer"), "HMMER's jackhmmer is required (apt-get install hmmer)"
    settings = SearchSettings(iterations=iterations)
    # many small blocks and two threads: the merged hits must equal one pass of the binary
    results = search_database(_queries(family_db), SequenceDatabase.open(family_db["gz"]),
                              settings, workers=2, block_residues=50_000)
    for res in results:
        ours = _row_names(res.msa)[1:]
        sto = run_jackhmmer((res.query.stem, res.query.sequence), family_db["fasta"], settings,
                            tmp_path / res.query.stem)
        ref = stockholm_names(sto)[1:]
        assert ours == ref, f"{res.query.stem}: {sorted(set(ours) ^ set(ref))[:5]}"
        assert len(ours) >= 28
        assert res.searched_sequences == sum(1 for ln in open(family_db["fasta"]) if ln[0] == ">")


def test_finds_family_members_and_no_decoys(family_db):
    """Three iterations recover >= 90% of every family; nothing else but true homologs (the
    globins myoglobin/hemoglobin find each other); no decoy and no proteome protein."""
    results = search_database(_queries(family_db), SequenceDatabase.open(family_db["gz"]),
                              SearchSettings(iterations=3), workers=2)
    for res in results:
        fam = res.query.stem
        hits = {n.rsplit("/", 1)[0] for n in _row_names(res.msa)[1:]}
        kinds = {h.split("|")[0] for h in hits}
        assert kinds == {"fam"}, f"{fam}: non-family hits {sorted(hits)[:5]}"
        own = {h for h in hits if h.split("|")[1] == fam}
        others = {h.split("|")[1] for h in hits - own}
        assert others <= (GLOBINS - {fam} if fam in GLOBINS else set()), (fam, others)
        recall = len(own) / len(family_db["members"][fam])
        assert recall >= 0.9, f"{fam}: {len(own)}/{len(family_db['members'][fam])}"


def test_block_size_and_threads_do_not_change_results(family_db):
    db = SequenceDatabase.open(family_db["gz"])
    queries = _queries(family_db, ("102m_A", "5zyh_A"))
    settings = SearchSettings(iterations=2)
    a = search_database(queries, db, settings, workers=1)                 # one block
    b = search_database(queries, db, settings, workers=2, block_residues=20_000)
    for x, y in zip(a, b):
        assert _row_names(x.msa) == _row_names(y.msa)
        assert alignment_to_a3m(x.msa, 10_000).text == alignment_to_a3m(y.msa, 10_000).text
        assert x.searched_sequences == y.searched_sequences


def test_hmmpgmd_database_gives_the_fasta_hits(family_db, tmp_path):
    """HMMER's preformatted daemon database (a '#' statistics line, then FASTA records) is read
    as such, plain or gzipped, and gives exactly the hits of the same sequences as FASTA."""
    import gzip

    text = gzip.decompress(family_db["gz"].read_bytes()).decode()
    n_seq = text.count(">")
    n_res = sum(len(ln.strip()) for ln in text.splitlines() if not ln.startswith(">"))
    body = f"#{n_res} {n_seq} 1 {n_seq} {n_seq} 2026-12-03\n" + text
    plain = tmp_path / "mini.hmmpgmd"
    plain.write_text(body)
    zipped = tmp_path / "mini2.hmmpgmd.gz"
    zipped.write_bytes(gzip.compress(body.encode()))
    queries = _queries(family_db, ("102m_A", "5zyh_A"))
    settings = SearchSettings(iterations=2)
    want = search_database(queries, SequenceDatabase.open(family_db["gz"]), settings, workers=2)
    for path in (plain, zipped):
        db = SequenceDatabase.open(path)
        assert db.easel_format == "hmmpgmd" and db.name in ("mini", "mini2")
        got = search_database(queries, db, settings, workers=2)
        for x, y in zip(want, got):
            assert _row_names(x.msa) == _row_names(y.msa)
            assert alignment_to_a3m(x.msa, 10_000).text == alignment_to_a3m(y.msa, 10_000).text


def test_database_is_streamed_in_bounded_blocks(family_db, data_dir):
    db = SequenceDatabase.open(family_db["gz"])
    longest = max(len(s) for _, s in family_records(data_dir))
    sizes = [sum(len(s) for s in block) for block in db.blocks(residues=30_000)]
    assert len(sizes) > 20 and max(sizes) <= 30_000 + longest


def test_outputs_round_trip_through_the_store_parser(family_db, tmp_path):
    """a3m (insertions lowercase) and Stockholm of the same search parse to the same MSA with
    protdp.data.parse (a3m reader vs Biopython's Stockholm reader + projection on the query);
    the depth/coverage the TSV reports equal what the parsed a3m holds."""
    queries = _queries(family_db, ("5zyh_A", "T1001"))
    settings = SearchSettings(iterations=2)
    report = search_targets(queries, [family_db["gz"]], tmp_path / "out", settings=settings,
                            workers=2, progress=False)
    assert [r["status"] for r in report.rows] == ["searched", "searched"]
    for q, row in zip(queries, report.rows):
        a3m = parse_msa(tmp_path / "out" / q.stem / "families.a3m")
        sto = parse_msa(tmp_path / "out" / q.stem / "stockholm" / "families.sto")
        assert a3m.query == q.sequence == sto.query
        assert a3m.sequences == sto.sequences
        np.testing.assert_array_equal(a3m.deletion_matrix, sto.deletion_matrix)
        assert a3m.deletion_matrix.sum() > 0, "this family has insertions"
        text = (tmp_path / "out" / q.stem / "families.a3m").read_text()
        assert any(c.islower() for c in text.split("\n", 2)[2])
        mark = json.loads((tmp_path / "out" / q.stem / ".families.search.json").read_text())
        gaps = (a3m.tokens() == 21)                                    # [N, L] GAP_ID
        assert mark["coverage"] == (~gaps[1:]).sum(0).tolist()
        assert int(row["depth"]) == a3m.depth == mark["depth"]
    tsv = (tmp_path / "out" / "msa_search.tsv").read_text().splitlines()
    assert tsv[0].startswith("target\tstem\tdatabase\tstatus\tdepth") and len(tsv) == 3


def test_max_sequences_truncates_in_hit_order(family_db, tmp_path):
    q = _queries(family_db, ("2p90_A02",))
    settings = SearchSettings(max_sequences=25)
    search_targets(q, [family_db["gz"]], tmp_path, settings=settings, progress=False)
    sto_rows = stockholm_names(tmp_path / "2p90_A02" / "stockholm" / "families.sto")
    full = search_database(q, SequenceDatabase.open(family_db["gz"]), SearchSettings())[0]
    assert sto_rows == _row_names(full.msa)[:25]
    a3m = parse_msa(tmp_path / "2p90_A02" / "families.a3m")
    mark = json.loads((tmp_path / "2p90_A02" / ".families.search.json").read_text())
    # the query's own copy in the database aligns identically: dropped as a duplicate
    assert mark["duplicates"] >= 1 and mark["truncated"] == len(full.msa.names) - 25
    assert a3m.depth == mark["depth"] == 25 - mark["duplicates"]


def _cli(args, capsys):
    rc = protdp_main(["msa", "search", *map(str, args)])
    return rc, capsys.readouterr()


def test_cli_resume_and_bad_records(family_db, tmp_path, capsys):
    fasta = tmp_path / "t.fasta"
    members = family_db["members"]
    fasta.write_text(f">T1055 a CASP target\n{members['T1055'][0]}\n>bad\nAC1DE\n"
                     f">2qke_E\n{members['2qke_E'][0]}\n")
    out = tmp_path / "msas"
    rc, cap = _cli(["--fasta", fasta, "--db", family_db["gz"], "--out", out, "--no-progress",
                    "--search-workers", "1"], capsys)
    assert rc == 0 and "2 searched, 0 already done, 1 rejected" in cap.out
    assert "t.fasta:3" in cap.err and "position 3" in cap.err
    a3m = out / "T1055" / "families.a3m"
    stamp = a3m.stat().st_mtime_ns
    rc, cap = _cli(["--fasta", fasta, "--db", family_db["gz"], "--out", out, "--no-progress"],
                   capsys)
    assert rc == 0 and "0 searched, 2 already done" in cap.out
    assert a3m.stat().st_mtime_ns == stamp
    rows = [ln.split("\t") for ln in (out / "msa_search.tsv").read_text().splitlines()[1:]]
    assert [(r[0], r[3]) for r in rows] == [("T1055", "skipped"), ("2qke_E", "skipped"),
                                            ("bad", "error")]
    # other settings -> a new search of the same targets
    rc, cap = _cli(["--fasta", fasta, "--db", family_db["gz"], "--out", out, "--no-progress",
                    "--max-sequences", "5"], capsys)
    assert "2 searched" in cap.out and parse_msa(a3m).depth <= 5


def test_kill_mid_run_then_resume(family_db, tmp_path):
    """kill -9 after the first batch is written: no half-written MSA; the rerun searches only
    what was not finished."""
    members = family_db["members"]
    fasta = tmp_path / "t.fasta"
    names = ["5zyh_A", "T1001", "102m_A", "2p90_A02"]
    fasta.write_text("".join(f">{n}\n{members[n][1]}\n" for n in names))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "protdp.cli", "msa", "search", "--fasta", str(fasta), "--db",
           str(family_db["gz"]), "--out", str(out), "--search-batch", "1", "--no-progress",
           "--iterations", "3", "--search-workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    import time
    deadline = time.time() + 120
    while not list(out.glob("*/.families.search.json")) and time.time() < deadline:
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    done = {p.parent.name for p in out.glob("*/.families.search.json")}
    assert 1 <= len(done) < len(names), "kill should land mid-run"
    for a3m in out.glob("*/families.a3m"):
        parse_msa(a3m)                                       # every visible a3m is whole
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"{len(names) - len(done)} searched, {len(done)} already done" in res.stdout


def test_hostile_databases(tmp_path, capsys, family_db):
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">q\nMVLSEGEWQLVLHVWAKVEADVAGHGQDILIRLFKSHPETLEKFDRFKHLKTEAEMKASED\n")
    blob = Path(family_db["gz"]).read_bytes()
    cases = {
        "truncated.fasta.gz": (blob[: len(blob) // 2], "truncated"),
        "garbage.fasta": (bytes(range(256)) * 10, "line 1 starts with"),
        "binary.fasta": (b"\x1b[31m\xff" * 50, "expected a '>' header"),
        "nul.fasta": (b">a\nAC\x00DE\n", "illegal character 'byte 0x00'"),
        "empty.fasta": (b"", "empty"),
        "headers.fasta": (b">a\n>b\n", "header without a sequence"),
        "dna.fasta": (b">a\nACGTTGCA\n>b\nacgun\n", "looks like nucleotides"),
        "notgzip.fasta.gz": (b">a\nACDE\n", "gzip"),
    }
    for name, (data, expect) in cases.items():
        db = tmp_path / name
        db.write_bytes(data)
        rc, cap = _cli(["--fasta", fasta, "--db", db, "--out", tmp_path / f"o_{name}",
                        "--no-progress"], capsys)
        lines = cap.err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and "Traceback" not in cap.err, (name, cap.err)
        assert str(db.resolve()) in lines[0] and expect in lines[0], (name, lines[0])
    rc, cap = _cli(["--fasta", fasta, "--db", tmp_path / "missing.fa", "--out", tmp_path / "o"],
                   capsys)
    assert rc == 2 and "not found" in cap.err
    with pytest.raises(InputError, match="not found"):
        SequenceDatabase.open(tmp_path / "nope.fasta.gz")
    assert gzip.decompress(blob)  # the intact archive itself is fine


def test_cli_help_and_bad_flags(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        protdp_main(["msa", "search", "--help"])
    assert exc.value.code == 0 and "--db" in capsys.readouterr().out
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">q\nMKV\n")
    for flags, expect in ((["--iterations", "0"], "iterations"),
                          (["--evalue", "nan"], "evalue"),
                          (["--search-workers", "0"], "search-workers"),
                          (["--max-sequences", "0"], "max_sequences")):
        rc, cap = _cli(["--fasta", fasta, "--db", fasta, "--out", tmp_path / "o", *flags], capsys)
        assert rc == 2 and expect in cap.err and "Traceback" not in cap.err
    empty = tmp_path / "empty.fasta"
    empty.write_bytes(b"")
    rc, cap = _cli(["--fasta", empty, "--db", fasta, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "no FASTA records" in cap.err and str(empty) in cap.err
    nul = tmp_path / "nul.fasta"
    nul.write_bytes(b">a\x00b\nMK\x00V\n")          # every record bad: reported, exit 1
    rc, cap = _cli(["--fasta", nul, "--db", fasta, "--out", tmp_path / "o2", "--no-progress"],
                   capsys)
    assert rc == 1 and "U+0000" in cap.err and "Traceback" not in cap.err


def test_bad_database_records_are_skipped_and_named(tmp_path, capsys, family_db):
    """Issue 28: one record over HMMER's 100,000-residue limit, a digit in a sequence or a
    header-only record is skipped and named, the rest searched (the hits equal those of the
    database without them); a 4 MiB header is cut to a bounded name (the Stockholm writer pads
    every row to the longest name: main wrote a 1.15 GB file); a BOM is dropped; a directory,
    FIFO or device as --db is named as such (main: 'not found')."""
    import os
    from protdp.msa.run import search_targets
    from protdp.msa.sanitize import MAX_NAME_BYTES

    good = gzip.decompress(Path(family_db["gz"]).read_bytes())
    huge_name = b"H" * (4 << 20)
    first = good.index(b"\n>") + 1                     # rename the second record's header line
    end = good.index(b"\n", first)
    hostile = (b"\xef\xbb\xbf>digits\nAC1DE\n>headeronly\n>long\n" + b"ACDEFGHIKL" * 10_001
               + b"\n" + good[:first] + b">" + huge_name + b" description\n" + good[end + 1:])
    db = tmp_path / "hostile.fasta"
    db.write_bytes(hostile)
    queries = _queries(family_db, ("102m_A",))
    settings = SearchSettings(iterations=1)
    report = search_targets(queries, [db], tmp_path / "out", settings=settings, progress=False)
    err = capsys.readouterr().err
    for n, name, why in ((1, "digits", "illegal character '1'"),
                         (2, "headeronly", "header without a sequence"), (3, "long", "longer than HMMER's 100,000")):
        assert f"record {n} ('{name}') skipped: {why}" in err, err
    assert report.rows[0]["status"] == "searched"
    sto = next((tmp_path / "out").rglob("*.sto"))
    assert sto.stat().st_size < 10 << 20
    want = search_database(queries, SequenceDatabase.open(family_db["fasta"]), settings)
    got = search_database(queries, SequenceDatabase.open(db), settings)
    cut = huge_name[:MAX_NAME_BYTES].decode()
    assert [n.split("/")[0] for n in _row_names(got[0].msa)] == [
        cut if n.split("/")[0] == good[first + 1:end].split()[0].decode() else n.split("/")[0]
        for n in _row_names(want[0].msa)]
    fifo = tmp_path / "fifo.fasta"
    os.mkfifo(fifo)
    for bad, what in ((tmp_path, "a directory"), (fifo, "named pipe"),
                      (Path("/dev/zero"), "character device")):
        with pytest.raises(InputError, match=what):
            SequenceDatabase.open(bad)
