"""Complex FASTA inputs (protdp.complex.inputs): ColabFold's 'A:B' records, AlphaFold's one
file per complex (and a folder of them), AlphaFold's chain ids; hostile complexes (300 chains,
an empty chain, a single chain, a bad letter) give one line naming file and line, and the
other complexes of the batch are read as usual."""

from __future__ import annotations

import gzip

import pytest

from protdp.errors import InputError
from protdp.complex.inputs import (CHAIN_IDS, MAX_CHAINS, read_alphafold_fasta,
                                    read_colabfold_fasta, read_complexes)


def _write(path, text):
    path.write_text(text)
    return path


def test_colabfold_records_are_complexes_with_alphafold_chain_ids(tmp_path):
    f = _write(tmp_path / "batch.fasta",
               ">het first\nMKVL:\nGSHM\n>homo\nmkv:MKV:MKV\n>bad\nMKV::GSH\n>ok2\nAC:DE\n")
    het, homo, bad, ok2 = read_colabfold_fasta(f)
    assert (het.complex_id, het.sequences, [c.chain_id for c in het.chains]) == (
        "het", ["MKVL", "GSHM"], ["A", "B"])                     # ':' may end a line
    assert het.chains[1].description == "het chain B" and not het.is_homomer
    assert homo.sequences == ["MKV"] * 3 and homo.is_homomer and homo.error is None
    assert bad.error == (f"{f}:6: chain 2 (B) of complex 'bad' is empty (a chain of length 0)")
    assert bad.chains == []
    assert ok2.error is None and ok2.index == 3 and ok2.sequences == ["AC", "DE"]


def test_colabfold_hostile_records_each_one_line(tmp_path):
    many = ":".join(["MK"] * 300)
    f = _write(tmp_path / "h.fa", f">many\n{many}\n>single\nMKV\n>trail\nMKV:\n"
                                  f">digit\nMK1:GS\n>many\nAC:DE\n>good\nAC:DE\n")
    many_t, single, trail, digit, dup, good = read_colabfold_fasta(f)
    assert many_t.error == (f"{f}:1: complex 'many' has 300 chains; at most 62 are supported "
                            f"(AlphaFold's chain ids A-Z, a-z, 0-9)")
    assert single.error == (f"{f}:3: complex 'single' has a single chain; a complex needs at "
                            f"least 2 (predict a single chain as a monomer)")
    assert "chain 2 (B) of complex 'trail' is empty" in trail.error
    assert digit.error == (f"{f}:7: chain 1 (A) of complex 'digit': invalid character '1' at "
                           f"position 3; expected one-letter amino-acid codes")
    assert dup.error == f"{f}:9: duplicate complex id 'many' (first at line 1)"
    assert good.error is None
    for t in (many_t, single, trail, digit, dup):
        assert "\n" not in t.error


def test_the_62nd_chain_is_accepted_and_ids_follow_alphafold():
    assert MAX_CHAINS == 62 and CHAIN_IDS[:3] == "ABC" and CHAIN_IDS[26] == "a"
    assert CHAIN_IDS[-1] == "9" and len(set(CHAIN_IDS)) == 62


def test_62_and_63_chains(tmp_path):
    f = _write(tmp_path / "x.fa", ">a\n" + ":".join(["G"] * 62) + "\n>b\n"
               + ":".join(["G"] * 63) + "\n")
    a, b = read_colabfold_fasta(f)
    assert a.error is None and [c.chain_id for c in a.chains] == list(CHAIN_IDS)
    assert "has 63 chains; at most 62" in b.error


def test_alphafold_one_file_per_complex(tmp_path):
    f = _write(tmp_path / "dimer.fasta", ">hbA alpha\nVLSPADK\nTNV\n>hbB beta\nVHLTPEE\n")
    t = read_alphafold_fasta(f)
    assert t.complex_id == "dimer" and t.error is None
    assert [(c.chain_id, c.sequence, c.description, c.line) for c in t.chains] == [
        ("A", "VLSPADKTNV", "hbA alpha", 1), ("B", "VHLTPEE", "hbB beta", 4)]
    assert read_complexes(f)[0].sequences == t.sequences       # no ':' -> AlphaFold form


def test_alphafold_form_hostile(tmp_path):
    one = read_alphafold_fasta(_write(tmp_path / "one.fasta", ">only\nMKV\n"))
    assert one.error == (f"{tmp_path / 'one.fasta'}:1: complex 'one' has a single chain; a "
                         f"complex needs at least 2 (predict a single chain as a monomer)")
    empty = read_alphafold_fasta(_write(tmp_path / "e.fasta", ">a\nMKV\n>b\n\n>c\nGS\n"))
    assert empty.error == f"{tmp_path / 'e.fasta'}:3: chain 2 (B) of complex 'e' is empty " \
                          f"(a chain of length 0)"
    mixed = read_alphafold_fasta(_write(tmp_path / "m.fasta", ">a\nMKV\n>b\nGS:HM\n"))
    assert mixed.error.startswith(f"{tmp_path / 'm.fasta'}:3: ':' inside a record")
    big = read_alphafold_fasta(_write(tmp_path / "big.fasta",
                                      "".join(f">c{i}\nMK\n" for i in range(300))))
    assert "'big' has 300 chains; at most 62" in big.error
    junk = read_alphafold_fasta(_write(tmp_path / "j.fasta", "MKV\n>a\nGS\n"))
    assert junk.error == f"{tmp_path / 'j.fasta'}:1: sequence before the first '>' header"


def test_folder_of_complexes_goes_on_past_a_bad_file(tmp_path):
    _write(tmp_path / "a_dimer.fasta", ">x\nMKV\n>y\nGSH\n")
    _write(tmp_path / "b_bad.fasta", ">x\nMKV\n>y\n\n")
    with gzip.open(tmp_path / "c_gz.fa.gz", "wt") as fh:
        fh.write(">x\nMKV\n>y\nMKV\n")
    _write(tmp_path / "notes.txt", "not a complex")
    a, b, c = read_complexes(tmp_path)
    assert (a.complex_id, a.error) == ("a_dimer", None)
    assert "chain 2 (B) of complex 'b_bad' is empty" in b.error
    assert (c.complex_id, c.sequences, c.is_homomer) == ("c_gz", ["MKV", "MKV"], True)


def test_empty_inputs_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="no FASTA records"):
        read_colabfold_fasta(_write(tmp_path / "e.fa", "\n\n"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no FASTA files"):
        read_complexes(tmp_path / "empty")
