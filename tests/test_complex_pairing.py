"""AlphaFold-Multimer features and MSA pairing (protdp.complex) against DeepMind's JAX
AlphaFold v2.3.2 fixture (`af2_reference/multimer`): protdp's pairing, deduplication,
cropping and merging of the fixture's raw per-chain inputs (a3m, UniProt Stockholm, template
dicts) reproduce AlphaFold's `np_example` field by field (shape, dtype, every value). Plus the
pairing rules on small hand-made alignments whose expected pairing is worked out in the test."""

from __future__ import annotations

import json
import os
from pathlib import Path
import numpy as np
import pytest

from protdp.data.parse import Msa, parse_msa
from protdp.data.residues import GAP_ID, msa_row_to_ids
from protdp.complex.features import (ChainInput, complex_features,
                                      write_pairing_report)
from protdp.complex.pairing import (MAX_ROWS_PER_SPECIES, UniprotChainMsa, pair_rows,
                                     species_of)
from protdp.paths import data_root

# $PROTDP_AF2_REFERENCE or af2_reference/ beside the data corpus (as tests/model_fixtures.py)
FIXTURE = Path(os.environ.get("PROTDP_AF2_REFERENCE") or data_root().parent / "af2_reference"
               ) / "multimer"
RAW = FIXTURE / "raw_inputs"
CASES = {"4hhb_hbA1-36_hbB1-40": [("hbA_1-36", True), ("hbB_1-40", True)],
         "2p90_A02_x2": [("2p90_A02", False), ("2p90_A02", False)]}


def _chain(cid: str, name: str, uniprot: bool) -> ChainInput:
    msa = parse_msa(RAW / f"{name}.a3m")
    return ChainInput(cid, msa.query, msa,
                      parse_msa(RAW / f"{name}.uniprot_hits.sto") if uniprot else None,
                      dict(np.load(RAW / f"templates_{name}.npz")))


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    name = request.param
    chains = [_chain("AB"[k], n, u) for k, (n, u) in enumerate(CASES[name])]
    return name, chains, complex_features(chains)


def test_features_equal_alphafold_field_by_field(case):
    name, _, out = case
    ref = np.load(FIXTURE / f"features_{name}.npz")
    assert sorted(out.features) == sorted(ref.files)
    for key in ref.files:
        got, want = out.features[key], ref[key]
        assert got.shape == want.shape, (key, got.shape, want.shape)
        assert got.dtype == want.dtype, (key, got.dtype, want.dtype)
        assert np.array_equal(got, want), key


def test_pairing_report_names_the_rows_that_were_paired(case, tmp_path):
    name, chains, out = case
    path = write_pairing_report(tmp_path / "pairing.json", name, out.report)
    doc = json.loads(path.read_text())
    assert doc["complex_id"] == name and [c["chain_id"] for c in doc["chains"]] == ["A", "B"]
    if name.startswith("2p90"):
        assert doc["paired"] is False and "paired_rows" not in doc
        assert [c["entity_id"] for c in doc["chains"]] == [1, 1]
        return
    rows = doc["paired_rows"]
    # the README: query pairing + 22 species-paired rows, all of them covering both chains
    assert len(rows) == 23 and rows[0]["species"] is None and doc["paired_rows_cropped"] == 0
    uniprot = {c.chain_id: UniprotChainMsa.from_msa(c.uniprot) for c in chains}
    msa = out.features["msa"]
    offset = 0
    for cid, chain in zip("AB", chains):
        L = len(chain.sequence)
        for p, r in enumerate(rows):
            i = r["rows"][cid]
            assert r["names"][cid] == uniprot[cid].names[i]
            if p:
                assert species_of(r["names"][cid]) == r["species"]
            # the model input's paired block holds exactly the named row of each chain
            assert np.array_equal(msa[p, offset:offset + L], uniprot[cid].tokens[i])
        offset += L


def _msa(rows: list[str], names: list[str]) -> Msa:
    return Msa(rows, np.zeros((len(rows), len(rows[0])), np.uint8), names)


def _uni(rows, names):
    return UniprotChainMsa.from_msa(_msa(rows, names))


def test_species_identifiers_follow_uniprot_entry_names():
    assert species_of("tr|A0A146SKV9|A0A146SKV9_FUNHE") == "FUNHE"
    assert species_of("sp|P0C2L1|A3X1_LOXLA/5-80 extra words") == "LOXLA"
    assert species_of("sp|P69905_1|HBA_HUMAN") == "HUMAN"          # isoform suffix ignored
    assert species_of("tr|A0A146SKV9|A0A146SKV9_FUNHE_12") == "FUNHE"   # small BFD suffix
    for bad in ("tr|A0A|A0A_HUMAN",              # accession shorter than 6
                "tr|A0A146SKV9|A0A146SKV9",      # no species
                "tr|A0A146SKV9|A0A146SKV9_TOOLONG",
                "UniRef100_A0A146SKV9", "query", ""):
        assert species_of(bad) == "", bad


def test_malformed_species_header_is_counted_and_left_unpaired():
    a = _uni(["MKV", "MKL", "MRV"], ["qa", "tr|BROKEN|X", "tr|A0A000AAA1|A0A000AAA1_HUMAN"])
    b = _uni(["GSH", "GSA"], ["qb", "tr|A0A000BBB1|A0A000BBB1_HUMAN"])
    p = pair_rows([a, b])
    assert a.malformed == ["tr|BROKEN|X"] and b.malformed == []
    assert p.rows.tolist() == [[0, 0], [2, 1]] and p.species == ["", "HUMAN"]


def test_pairing_order_coverage_then_row_product_with_gap_rows():
    """Three chains. HUMAN in all three; MOUSE in A and C only (B gets the gap row -1); YEAST
    in B only (never paired); within a species rows pair by rank of identity to the query."""
    h = "tr|A0A000AAA{}|A0A000AAA{}_{}"
    a = _uni(["AAAA", "AAAC", "AACC", "ACCC"],
             ["qa", h.format(1, 1, "MOUSE"), h.format(2, 2, "HUMAN"), h.format(3, 3, "HUMAN")])
    b = _uni(["CCCC", "CCCA", "CCAA"], ["qb", h.format(4, 4, "HUMAN"), h.format(5, 5, "YEAST")])
    c = _uni(["DDDD", "DDAA", "DDDA", "DAAA"],
             ["qc", h.format(6, 6, "HUMAN"), h.format(7, 7, "MOUSE"), h.format(8, 8, "MOUSE")])
    p = pair_rows([a, b, c])
    # HUMAN: A's best is row 2 (AACC, 2/4 identical) over row 3; B has 1 row -> take 1.
    # MOUSE (2 chains): A row 1 pairs C's best MOUSE row 2 (DDDA); product |1*-1*2| = 2.
    assert p.rows.tolist() == [[0, 0, 0], [2, 1, 1], [1, -1, 2]]
    assert p.species == ["", "HUMAN", "MOUSE"]


def test_species_with_too_many_rows_is_not_paired():
    n = MAX_ROWS_PER_SPECIES + 1
    rows = ["MK"] + [("ACDEFGHIKLMNPQRSTVWY"[i % 20] + "ACDEFGHIKLMNPQRSTVWY"[i // 20 % 20])
                     for i in range(n)]
    names = ["qa"] + [f"tr|A0A{i:07d}|X{i}_HUMAN" for i in range(n)]
    a = UniprotChainMsa(np.stack([msa_row_to_ids(r) for r in rows]).astype(np.int32),
                        np.zeros((n + 1, 2), np.int32), names, [species_of(x) for x in names])
    b = _uni(["GS", "GA"], ["qb", "tr|A0A000BBB1|A0A000BBB1_HUMAN"])
    assert pair_rows([a, b]).rows.tolist() == [[0, 0]]


def test_heteromer_with_two_copies_merges_the_copies_densely():
    """A, B, A' -> AlphaFold's assembly order A_1, A_2, B_1 (asym 1, 2, 3): the copies of A sit
    side by side in one block (the same rows in both), B's unpaired block below."""
    ua = _msa(["MKVL", "MKVA", "MRVL"], ["qa", "tr|A0A000AAA1|A0A000AAA1_HUMAN", "x"])
    ub = _msa(["GSH", "GSA"], ["qb", "tr|A0A000BBB1|A0A000BBB1_HUMAN"])
    a = _msa(["MKVL", "MKIL", "MRVL"], ["qa", "r1", "r2"])
    b = _msa(["GSH", "GTH"], ["qb", "s1"])
    chains = [ChainInput("A", "MKVL", a, ua), ChainInput("B", "GSH", b, ub),
              ChainInput("C", "MKVL", a, ua)]
    out = complex_features(chains)
    f = out.features
    assert f["asym_id"].tolist() == [1] * 4 + [2] * 4 + [3] * 3
    assert f["entity_id"].tolist() == [1] * 8 + [2] * 3
    assert f["sym_id"].tolist() == [1] * 4 + [2] * 4 + [1] * 3
    assert [c["chain_id"] for c in out.report["chains"]] == ["A", "C", "B"]
    msa = f["msa"][: int(f["num_alignments"])]
    # 2 paired rows (queries, HUMAN); A's unpaired: MKIL, MRVL (MKVL/MKVA... deduplicated
    # against the paired rows MKVL, MKVA); B's unpaired: GTH
    assert msa.shape == (2 + 2 + 1, 11)
    assert np.array_equal(msa[:, :4], msa[:, 4:8])                  # dense copies
    assert (msa[2:4, 8:] == GAP_ID).all() and (msa[4, :8] == GAP_ID).all()
    assert f["cluster_bias_mask"][:5].tolist() == [1, 0, 0, 0, 0]
    assert f["bert_mask"][4, :8].sum() == 0 and f["bert_mask"][4, 8:].sum() == 3
    assert f["msa"].shape[0] == 512 and (f["msa_mask"][5:] == 0).all()


def test_heteromer_without_uniprot_alignment_is_refused():
    a = _msa(["MKV"], ["qa"])
    b = _msa(["GSH"], ["qb"])
    with pytest.raises(ValueError, match="chain B: a heteromer needs"):
        complex_features([ChainInput("A", "MKV", a, a), ChainInput("B", "GSH", b, None)])



def test_pairing_alignment_of_another_sequence_is_refused():
    a = _msa(["MKV"], ["qa"])
    b = _msa(["GSH"], ["qb"])
    with pytest.raises(ValueError, match="chain B: the UniProt alignment's query"):
        complex_features([ChainInput("A", "MKV", a, a), ChainInput("B", "GSH", b, a)])


def test_complex_features_cli_reproduces_alphafold_from_an_msa_folder(tmp_path, capsys):
    """The fixture's raw files laid out as `protdp msa search --complexes` writes them; the
    CLI's features equal AlphaFold's in every field but the templates (the CLI adds none). A
    second complex whose pairing alignment has a malformed UniProt name gets a warning line."""
    import shutil

    from protdp.cli import main as protdp_main

    inputs, msas = tmp_path / "complexes", tmp_path / "msas"
    inputs.mkdir()
    for cx in ("hb", "hb2"):
        (inputs / f"{cx}.fasta").write_text((RAW / "4hhb_hbA1-36_hbB1-40.fasta").read_text())
        for cid, name in (("A", "hbA_1-36"), ("B", "hbB_1-40")):
            folder = msas / f"{cx}_{cid}"
            (folder / "stockholm").mkdir(parents=True)
            shutil.copy(RAW / f"{name}.a3m", folder / "bfd.a3m")
            shutil.copy(RAW / f"{name}.uniprot_hits.sto", folder / "stockholm" / "uniprot.sto")
    (inputs / "hb3.fasta").write_text((RAW / "4hhb_hbA1-36_hbB1-40.fasta").read_text())
    sto = msas / "hb2_A" / "stockholm" / "uniprot.sto"
    first = next(ln.split()[0] for ln in sto.read_text().splitlines() if ln.startswith("tr|"))
    sto.write_text(sto.read_text().replace(first, "tr|BAD|HEADER_"))
    rc = protdp_main(["complex", "features", "--fasta", str(inputs), "--msa-dir",
                      str(tmp_path / "msa"), "--out", str(tmp_path / "out")])   # a typo
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"{tmp_path / 'msa'}: MSA directory not found" in err[0]
    rc = protdp_main(["complex", "features", "--fasta", str(inputs), "--msa-dir", str(msas),
                      "--out", str(tmp_path / "out")])
    cap = capsys.readouterr()
    assert rc == 0 and "3 complexes: 2 ok, 1 rejected" in cap.out, cap
    assert f"rejected: hb3: {inputs / 'hb3.fasta'}:1: complex 'hb3' chain A: no MSA under " \
           f"{msas / 'hb3_A'} (run `protdp msa search --complexes` first)" in cap.err
    warn = [ln for ln in cap.err.splitlines() if "warning" in ln]
    assert warn == ["  warning: hb2: chain A: 1 UniProt-style row name(s) without a readable "
                    "species (first: 'tr|BAD|HEADER_'), left unpaired"]
    got = np.load(tmp_path / "out" / "hb" / "features.npz")
    ref = np.load(FIXTURE / "features_4hhb_hbA1-36_hbB1-40.npz")
    assert sorted(got.files) == sorted(ref.files)
    for key in ref.files:
        if key.startswith("template_") or key == "num_templates":
            continue
        assert got[key].dtype == ref[key].dtype and np.array_equal(got[key], ref[key]), key
    assert int(got["num_templates"]) == 0 and not got["template_all_atom_mask"].any()
    doc = json.loads((tmp_path / "out" / "hb2" / "pairing.json").read_text())
    assert doc["uniprot_msas"]["A"]["malformed_uniprot_names"] == 1
    assert len(doc["paired_rows"]) < 23        # the malformed row's species lost a pair
    # a chain searched only in the pairing database: the line says so (it said both hints)
    (msas / "hb3_A").mkdir()
    shutil.copy(RAW / "hbA_1-36.a3m", msas / "hb3_A" / "uniprot.a3m")
    rc = protdp_main(["complex", "features", "--fasta", str(inputs / "hb3.fasta"), "--msa-dir",
                      str(msas), "--out", str(tmp_path / "out3")])
    err = capsys.readouterr().err
    assert rc == 1 and f"chain A: no MSA under {msas / 'hb3_A'} (only the pairing database " \
        "'uniprot', which pairs the chains but is not their MSA: search e.g. UniRef90 too)" in err
