"""Screening list: exact long k-mer matches (coordinates, k boundary, short entries), phmmer
mode for diverged homologs, FASTA errors, pickling for build workers."""

from __future__ import annotations

import pickle

import pytest

from protdp.errors import ConfigError, InputError
from protdp.paths import REPO_ROOT
from protdp.data.screening import ScreeningList, read_fasta

DEMO = REPO_ROOT / "configs/screening/demo_list.fasta"
UBQ = "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG"


def test_demo_list_entries_are_the_real_proteins(data_dir):
    from protdp.data.parse import parse_structure
    entries = dict(read_fasta(DEMO))
    assert len(entries) == 2
    seqs = set(entries.values())
    assert parse_structure(data_dir / "structures_only/1ubi.pdb", "A").sequence in seqs
    assert parse_structure(data_dir / "structures_only/1aki.cif", "A").sequence in seqs


def test_kmer_hit_coordinates_and_k_boundary():
    screen = ScreeningList.from_fasta(DEMO, k=20)
    q = "PPPP" + UBQ[10:40] + "WWWW"
    hits = screen.hits(q)
    assert len(hits) == 1
    h = hits[0]
    assert (h.query_start, h.query_end, h.entry_start, h.entry_end) == (4, 34, 10, 40)
    assert h.entry.startswith("sp|P0CG48") and h.length == 30 and h.method == "kmer"
    assert screen.hits("PPPP" + UBQ[10:29] + "WWWW") == []          # 19 shared residues
    assert len(screen.hits("PPPP" + UBQ[10:30] + "WWWW")) == 1      # exactly 20
    assert screen.hits("mqifvktltg kTITLEVEPSDTIENV") != []        # case/space-insensitive
    assert not screen.is_flagged("A" * 200)


def test_two_separate_segments_and_short_entries():
    screen = ScreeningList([("long", UBQ), ("short", "WHWHWH")], k=20)
    q = UBQ[0:25] + "PPPPPPPP" + UBQ[40:70] + "WHWHWH"
    hits = sorted(screen.hits(q), key=lambda h: h.query_start)
    assert [(h.entry, h.query_start, h.query_end) for h in hits] == [
        ("long", 0, 25), ("long", 33, 63), ("short", 63, 69)]


def test_phmmer_finds_diverged_homolog_that_kmer_misses():
    mutated = "".join("A" if i % 8 == 0 and c != "A" else c for i, c in enumerate(UBQ))
    kmer = ScreeningList.from_fasta(DEMO, k=20)
    hmm = ScreeningList.from_fasta(DEMO, k=20, mode="phmmer")
    assert kmer.hits(mutated) == []
    hits = hmm.hits(mutated)
    assert hits and hits[0].method == "phmmer" and hits[0].evalue < 1e-10
    assert hmm.hits("W" * 30 + "PG" * 20) == []


def test_errors_and_pickling(tmp_path):
    bad = tmp_path / "bad.fasta"
    bad.write_text(">ok\nACDE\n>bad\nAC1DE\n")
    with pytest.raises(InputError) as err:
        read_fasta(bad)
    assert err.value.line == 4
    bad.write_text("ACDE\n")
    with pytest.raises(InputError, match="before the first"):
        read_fasta(bad)
    bad.write_bytes(b"\x7fELF\x02\x01\x01\x00\xf0\x9f")   # was a UnicodeDecodeError traceback
    with pytest.raises(InputError, match="bad.fasta:1: not a text file: NUL byte"):
        read_fasta(bad)
    from protdp.data.filters import FilterConfig, load_screening
    (tmp_path / "folder.fasta").mkdir()
    for name, why in (("folder.fasta", "a directory, not a screening list"),
                      ("nope.fasta", "screening list \\(FASTA\\) not found")):
        with pytest.raises(ConfigError, match=f"{name}: {why}"):     # said "config file"
            load_screening(FilterConfig(screening_fasta=str(tmp_path / name)))
    with pytest.raises(ConfigError):
        ScreeningList([("a", UBQ)], k=3)
    with pytest.raises(ConfigError):
        ScreeningList([("a", UBQ)], mode="blast")
    screen = pickle.loads(pickle.dumps(ScreeningList.from_fasta(DEMO, k=25)))
    assert screen.k == 25 and screen.hits(UBQ)[0].length == len(UBQ)
