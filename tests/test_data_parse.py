"""Parsers: a3m/Stockholm conventions on hand-written strings, real files against Biopython's
and gemmi's own readings, every edge case loads or fails with a clear InputError."""

from __future__ import annotations

import csv
import re

import gemmi
import numpy as np
import pytest
from Bio import AlignIO, SeqIO

from protdp.data.parse import (merge_msas, pair_msa_structure, parse_a3m, parse_msa,
                               parse_structure, virtual_cb)
from protdp.data.residues import UNK_ID
from protdp.errors import InputError


def _pairs(data_dir):
    with open(data_dir / "PAIRS.tsv") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


# ------------------------------------------------------------------------------- a3m strings

def test_a3m_deletions_hand_written():
    text = (">query some description\nACDEFG\n"
            ">r1\nAC-EFG\n"
            ">r2\nmAkkCDEFWq\n"            # m before A, kk before C, trailing q dropped
            ">r3\n-CDyyyEF-\n")
    msa = parse_a3m(text)
    assert msa.sequences == ["ACDEFG", "AC-EFG", "ACDEFW", "-CDEF-"]
    np.testing.assert_array_equal(msa.deletion_matrix, [[0, 0, 0, 0, 0, 0],
                                                        [0, 0, 0, 0, 0, 0],
                                                        [1, 2, 0, 0, 0, 0],
                                                        [0, 0, 0, 3, 0, 0]])
    assert msa.deletion_matrix.dtype == np.uint8
    assert msa.names == ["query", "r1", "r2", "r3"]
    # AF2 deduplicates on the aligned sequence (insertions ignored): keep the first
    assert parse_a3m(">q\nACD\n>r\nAkkCD\n").depth == 1


def test_a3m_messy_formatting():
    text = ("#154\t1\r\n>ss_pred\r\nCCHHHE\r\n>ss_conf\r\n998877\r\n"
            ">q\r\nACD\r\nEFG*\r\n\r\n"
            ">dup\r\nACDEFG\r\n"               # duplicate of the query: removed
            ">x1 desc\r\nBZUOJX\r\n"            # non-standard letters -> X
            ">x2\r\nAC.EFG\r\n")
    msa = parse_a3m(text)
    assert msa.query == "ACDEFG"
    assert msa.sequences == ["ACDEFG", "XXXXXX", "AC-EFG"]
    assert (msa.tokens()[1] == UNK_ID).all()
    assert msa.names == ["q", "x1", "x2"]


def test_a3m_deletions_clipped_to_uint8():
    msa = parse_a3m(">q\nAC\n>r\nA" + "g" * 300 + "W\n")
    assert msa.deletion_matrix[1].tolist() == [0, 255]


def test_a3m_row_length_error_names_row_and_line():
    with pytest.raises(InputError) as err:
        parse_a3m(">q\nACDE\n>ok\nACDE\n>bad\nACDEF\n", "x.a3m")
    assert err.value.line == 6 and "'bad'" in str(err.value) and "x.a3m:6" in str(err.value)


def test_clustal_given_as_a3m_is_rejected(data_dir):
    with pytest.raises(InputError, match="Clustal"):
        parse_msa(data_dir / "edge_cases/msa/hedgehog.aln", fmt="a3m")


# ------------------------------------------------------------------------ Stockholm strings

STO = """# STOCKHOLM 1.0
query   AC..DE-F
s1      ACgkWEHF
s2      A-..-EHF
//
"""
STO_BLOCKS = """# STOCKHOLM 1.0
query   AC..
s1      ACgk
s2      A-..

query   DE-F
s1      WEHF
s2      -EHF
//
"""


@pytest.mark.parametrize("text", [STO, STO_BLOCKS])
def test_stockholm_gap_column_projection(tmp_path, text):
    path = tmp_path / "x.sto"
    path.write_text(text)
    msa = parse_msa(path)
    assert msa.sequences == ["ACDEF", "ACWEF", "A--EF"]
    np.testing.assert_array_equal(msa.deletion_matrix, [[0, 0, 0, 0, 0],
                                                        [0, 0, 2, 0, 1],
                                                        [0, 0, 0, 0, 1]])


def test_aligned_fasta_projection(tmp_path):
    path = tmp_path / "x.fasta"
    path.write_text(">query\nAC--DE-F\n>s1\nACGKWEHF\n")
    msa = parse_msa(path)
    assert msa.sequences == ["ACDEF", "ACWEF"]
    assert msa.deletion_matrix[1].tolist() == [0, 0, 2, 0, 1]


# ------------------------------------------------------------------------------- real MSAs

def _biopython_query(path):
    if path.suffix in (".sto", ".sth"):
        seq = str(AlignIO.read(str(path), "stockholm")[0].seq)
    else:
        seq = str(next(SeqIO.parse(str(path), "fasta-blast")).seq)   # skips "#" lines
    seq = re.sub(r"[a-z.\-*]", "", seq)        # a3m insertions and gaps are not query residues
    return re.sub(r"[^ARNDCQEGHILKMFPSTWYV]", "X", seq)


def test_real_msa_queries_equal_biopython(data_dir):
    files = sorted({r["msa_file"] for r in _pairs(data_dir)})
    assert len(files) >= 28
    # the four largest (> 1.5 MB) are parsed by the store build test; keep this one quick
    for rel in [f for f in files if (data_dir / f).stat().st_size < 1_500_000]:
        path = data_dir / rel
        msa = parse_msa(path)
        assert msa.query == _biopython_query(path), rel
        assert msa.deletion_matrix.shape == (msa.depth, msa.length)
        assert len(set(msa.sequences)) == msa.depth             # deduplicated


# ------------------------------------------------------------------------------ structures

def _gemmi_ca(path, chain):
    """Reference: gemmi's first-model amino-acid residues with a CA (highest occupancy)."""
    st = gemmi.read_structure(str(path))
    st.remove_waters()
    out = []
    for ch in st[0]:
        if ch.name != chain:
            continue
        for res in ch:
            info = gemmi.find_tabulated_residue(res.name)
            if info is None or not info.is_amino_acid():
                continue
            cas = [a for a in res if a.name == "CA"]
            if cas:
                out.append(max(cas, key=lambda a: a.occ).pos.tolist())
    return np.array(out, np.float32)


def test_real_structures_against_gemmi_and_seqres(data_dir):
    for row in _pairs(data_dir):
        path = data_dir / row["structure_file"]
        chain = parse_structure(path, row["chain"])
        ref = _gemmi_ca(path, row["chain"])
        ours = chain.positions[chain.observed, 1]
        assert len(ours) == len(ref) == int(row["observed_residues"]), row["pair_id"]
        np.testing.assert_allclose(ours, ref, atol=1e-3)
        assert chain.positions.dtype == np.float32 and chain.mask.shape == (len(chain.sequence), 5)
        if path.suffix == ".pdb" and chain.has_seqres:
            seqres = {r.annotations["chain"]: str(r.seq) for r in SeqIO.parse(str(path),
                                                                             "pdb-seqres")}
            assert chain.sequence == seqres[row["chain"]]


def test_seqres_places_missing_residues(data_dir):
    chain = parse_structure(data_dir / "structures/2q2k.cif", "A")
    assert chain.has_seqres and len(chain.sequence) == 70 and chain.observed.sum() == 45
    st = gemmi.read_structure(str(data_dir / "structures/2q2k.cif"))
    # label_seq positions of observed residues in gemmi == our observed positions
    label = sorted({r.label_seq - 1 for r in st[0]["A"] if r.label_seq is not None})
    assert np.nonzero(chain.observed)[0].tolist() == label


def test_resolution_and_blank_chain(data_dir):
    assert parse_structure(data_dir / "structures/1a3a.pdb", "A").resolution == pytest.approx(1.8)
    assert np.isnan(parse_structure(data_dir / "structures/T1034-D1.pdb", "").resolution)
    assert parse_structure(data_dir / "edge_cases/structures/3zee_em.cif",
                           "A").resolution == pytest.approx(6.1)


def test_virtual_cb_for_glycine(data_dir):
    chain = parse_structure(data_dir / "structures/5awl.pdb", "A")   # YYDPETGTWY
    g = chain.sequence.index("G")
    assert chain.mask[g, 4]
    ca_cb = np.linalg.norm(chain.positions[g, 4] - chain.positions[g, 1])
    assert 1.40 < ca_cb < 1.60
    # the same construction reproduces the real CB of the other residues to within ~0.2 Å
    real = parse_structure(data_dir / "structures/1a3a.pdb", "A")
    keep = real.mask[:, :3].all(1) & real.mask[:, 4] & (np.array(list(real.sequence)) != "G")
    p = real.positions[keep]
    err = np.linalg.norm(virtual_cb(p[:, 0], p[:, 1], p[:, 2]) - p[:, 4], axis=-1)
    assert keep.sum() > 100 and np.median(err) < 0.2


# ---------------------------------------------------------------------------- edge cases

EDGE_MSA = {
    "209d_query_with_X.a3m": ("ok", 1), "6a5j_duplicate_query.a3m": ("ok", 1),
    "Cys_knot_duplicate_name.sth": ("error", "appears 2 times"),
    "T1078.with_ss2.a3m": ("ok", None), "boltz_seq2_query_with_X.a3m": ("ok", None),
    "empty.a3m": ("error", "empty"), "funny.sth": ("ok", None), "hedgehog.aln": ("ok", 5),
}


def test_every_edge_case_msa(data_dir):
    files = sorted(p.name for p in (data_dir / "edge_cases/msa").iterdir())
    assert files == sorted(EDGE_MSA)
    for name, (kind, detail) in EDGE_MSA.items():
        path = data_dir / "edge_cases/msa" / name
        if kind == "error":
            with pytest.raises(InputError, match=detail) as err:
                parse_msa(path)
            assert name in str(err.value)
        else:
            msa = parse_msa(path)
            assert detail is None or msa.depth == detail, name
            assert "ss_pred" not in msa.names and "ss_conf" not in msa.names
    x = parse_msa(data_dir / "edge_cases/msa/209d_query_with_X.a3m")
    assert (x.tokens()[0] == UNK_ID).sum() == 2


def test_every_edge_case_structure(data_dir):
    d = data_dir / "edge_cases/structures"
    errors = {"header_only_3efg.pdb": "header-only", "5moo_header_only.pdb": "header-only",
              "ions_only.pdb": "only ions"}
    for path in sorted(d.iterdir()):
        if path.name in errors:
            with pytest.raises(InputError, match=errors[path.name]):
                parse_structure(path, None)
            continue
        chain = parse_structure(path, None)
        assert len(chain.sequence) >= 1 and chain.positions.shape[0] == len(chain.sequence)
    assert "M" in parse_structure(d / "1a8o_mse.pdb", "A").sequence          # MSE -> M
    sep = parse_structure(d / "1gz2_sep.pdb", "A")
    cso = parse_structure(d / "1svy_cso.pdb", "A")
    assert "X" not in sep.sequence and "X" not in cso.sequence
    miss = parse_structure(d / "1dmg_missing.pdb", "A")
    assert miss.has_seqres and miss.observed.sum() < len(miss.sequence)
    one = parse_structure(d / "1ejg_one_atom.pdb", None)
    assert one.mask.sum() == 1 and not one.observed.any()
    for nmr in ("1l2y_nmr_38models.pdb", "1psm_nmr_20models.cif"):      # first model only
        ch = parse_structure(d / nmr, "A")
        np.testing.assert_allclose(ch.positions[ch.observed, 1], _gemmi_ca(d / nmr, "A"),
                                   atol=1e-3)
    alt = parse_structure(d / "1a6m_altlocs.pdb", "A")
    np.testing.assert_allclose(alt.positions[alt.observed, 1], _gemmi_ca(d / "1a6m_altlocs.pdb",
                                                                          "A"), atol=1e-3)
    with pytest.raises(InputError, match="chain 'Z' not found"):
        parse_structure(d / "1orc.pdb", "Z")


# ------------------------------------------------------------------------------- pairing

def test_pairing_terminal_difference_and_mismatch(data_dir):
    chain = parse_structure(data_dir / "structures/4hhb.pdb", "B")
    msa = parse_msa(data_dir / "msa/4hhb_B.colabfold.a3m")             # extra initiator Met
    paired = pair_msa_structure(msa.query, chain, "a.a3m", "4hhb.pdb")
    pos, mask = paired.all_atom_positions, paired.all_atom_mask
    assert pos.shape == (147, 37, 3) and not mask[0].any() and mask[1:, 1].all()
    assert paired.info["identity"] == 1.0 and paired.info["coverage"] == 1.0
    np.testing.assert_array_equal(paired.residue_index, np.arange(147))
    bad = msa.query[:60] + ("W" if msa.query[60] != "W" else "A") + msa.query[61:]
    with pytest.raises(InputError, match=r"a\.a3m.*4hhb\.pdb.*identity 0\.993.*1 residue "
                                         r"mismatch"):
        pair_msa_structure(bad, chain, "a.a3m", "4hhb.pdb")
    # a point mutant is accepted when the configured identity allows it
    assert pair_msa_structure(bad, chain, min_identity=0.99).info["identical"] == 145


def test_merge_msas_pads_terminal_difference(data_dir):
    a = parse_msa(data_dir / "msa/4hhb_B.colabfold.a3m")
    b = parse_msa(data_dir / "msa/4hhb_B.globins4.sto")
    m = merge_msas([b, a])
    assert m.query == a.query and m.length == 147
    assert len(set(m.sequences)) == m.depth and m.depth <= a.depth + b.depth
    with pytest.raises(InputError, match="differ"):
        merge_msas([a, parse_msa(data_dir / "msa/102m_A.colabfold.a3m")])


def test_insertion_codes_kept_in_file_order(data_dir):
    path = data_dir / "structures_only/5ptp.pdb"          # trypsin: 65A, 184A, 188A, 221A
    chain = parse_structure(path, "A")
    ids = chain.author_ids
    for ins in ("65A", "184A", "188A", "221A"):
        k = ids.index(ins)
        assert ids[k - 1] == ins[:-1] and ids[k + 1] == str(int(ins[:-1]) + 1)
    np.testing.assert_allclose(chain.positions[chain.observed, 1], _gemmi_ca(path, "A"),
                               atol=1e-3)
