"""The complex store (protdp.complex.store) and its training examples
(protdp.complex.training) on real assemblies: 4hhb (α2β2) and the 2q2k homodimer. Reference:
the monomer parser (`parse_structure`) read chain by chain and AlphaFold's assembly ids
written out by hand; bad complexes are one line each and the build goes on."""

from __future__ import annotations

import numpy as np
import pytest

from complex_fixtures import GOOD_ROWS, write_manifest
from protdp.data.atoms import read_structure
from protdp.data.parse import parse_structure
from protdp.data.store import FamilyStore
from protdp.errors import InputError
from protdp.complex.store import ComplexStore, build_complex_store, is_complex_store
from protdp.complex.training import complex_example
from protdp.paths import data_root

BAD_ROWS = [("gone", "structures/missing.cif", "A", "-"),
            ("gone", "structures/missing.cif", "B", "-"),
            ("nochain", "structures/2q2k.cif", "A", "-"),
            ("nochain", "structures/2q2k.cif", "Z", "-"),
            ("single", "structures/2q2k.cif", "A", "-"),
            ("wrongmsa", "structures/2q2k.cif", "A", "msa/5awl_A.single_seq.a3m"),
            ("wrongmsa", "structures/2q2k.cif", "B", "-")] + \
    [("huge", "structures/2q2k.cif", f"X{i}", "-") for i in range(300)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("cstore")
    lines = []
    report = build_complex_store(write_manifest(d / "m.tsv", GOOD_ROWS + BAD_ROWS), d / "c.h5",
                                 log=lines.append)
    return d / "c.h5", report, lines


def test_good_complexes_stored_and_each_bad_one_is_one_line(built):
    path, report, lines = built
    assert sorted(report.built) == ["2q2k", "4hhb"]
    assert len(report.rejected) == len(lines) == 5
    text = "\n".join(lines)
    for cid, what in (("gone", "missing.cif"), ("nochain", "chain Z"), ("single", "1 chain(s)"),
                      ("wrongmsa", "chain A"), ("huge", "300 chain(s)")):
        line = next(ln for ln in lines if ln.startswith(f"rejected {cid} "))
        assert what in line and "\n" not in line, line
    assert "Traceback" not in text
    assert is_complex_store(path)


def test_chains_ids_and_truth_match_the_monomer_parser(built):
    store = ComplexStore(built[0])
    rec = store.read("4hhb")
    ids = [(c["chain_id"], c["asym_id"], c["entity_id"], c["sym_id"]) for c in rec["chains"]]
    assert ids == [("A", 1, 1, 1), ("B", 2, 2, 1), ("C", 3, 1, 2), ("D", 4, 2, 2)]
    path = data_root() / "structures/4hhb.cif"
    data = read_structure(path)
    for c in rec["chains"]:
        chain = parse_structure(path, c["chain_id"], data=data)
        assert c["sequence"] == chain.sequence                     # MSA query == chain here
        np.testing.assert_array_equal(c["all_atom_mask"].astype(bool), chain.all_atom_mask)
        np.testing.assert_allclose(c["all_atom_positions"], chain.all_atom_positions)
    assert rec["chains"][0]["msa"].shape[0] > 1 and rec["chains"][1]["msa"].shape[0] == 1
    assert store.length("4hhb") == 2 * 141 + 2 * 146
    homo = store.read("2q2k")
    assert [c["entity_id"] for c in homo["chains"]] == [1, 1]
    assert [c["sym_id"] for c in homo["chains"]] == [1, 2]


def test_stores_refuse_each_other_by_name(built, tmp_path):
    with pytest.raises(InputError, match="no format_version"):
        FamilyStore(built[0])
    monomer = tmp_path / "mono.h5"
    import h5py
    with h5py.File(monomer, "w") as h5:
        h5.attrs["format_version"] = 2
    with pytest.raises(InputError, match="not a complex store"):
        ComplexStore(monomer)
    with pytest.raises(InputError, match="exists"):                # never replaces others' files
        build_complex_store(write_manifest(tmp_path / "m.tsv", GOOD_ROWS[4:]), monomer,
                            force=True)
    bad = tmp_path / "bad.tsv"
    bad.write_text("id\tfile\n")
    with pytest.raises(InputError, match="line 1"):
        build_complex_store(bad, tmp_path / "x.h5")


def test_training_example_crops_across_chains_deterministically(built):
    store = ComplexStore(built[0])
    rec = store.read("4hhb")
    modes = set()
    for seed in range(6):
        x = complex_example(rec, 48, seed, max_rows_per_chain=16)
        y = complex_example(rec, 48, seed, max_rows_per_chain=16)
        modes.add(x["crop_mode"])
        assert x["crop_mode"] == y["crop_mode"]
        for k in ("aatype", "asym_id", "all_atom_positions", "msa", "residue_index"):
            np.testing.assert_array_equal(x[k], y[k])
        assert x["aatype"].shape == (48,) and x["msa"].shape[1] == 48
        # AlphaFold's assembly order: entity 1 (A, C) then entity 2 (B, D)
        assert list(x["true_asym_id"][[0, 141, 282, 428]]) == [1, 2, 3, 4]
        assert list(x["true_entity_id"][[0, 141, 282, 428]]) == [1, 1, 2, 2]
        # the cropped truth is the full truth at (chain, position in chain)
        starts = {a: int(np.argmax(x["true_asym_id"] == a)) for a in (1, 2, 3, 4)}
        idx = [starts[int(a)] + int(r) for a, r in zip(x["asym_id"], x["residue_index"])]
        np.testing.assert_array_equal(x["all_atom_positions"], x["true_all_atom_positions"][idx])
        assert np.all(np.diff(x["asym_id"]) >= 0)
    assert modes == {"spatial", "contiguous"}
