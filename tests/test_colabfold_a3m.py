"""ColabFold's complex a3m (protdp.complex.colabfold_a3m) and pair modes (issue 46).

Reference: AlphaFold v2.3.2's own pairing of the multimer fixture (`af2_reference/multimer`).
The fixture's paired rows (our species pairing, which equals AlphaFold's field by field:
tests/test_complex_pairing.py) and unpaired rows are written in ColabFold's layout with our
writer, read back, and the features must equal DeepMind's `features_<case>.npz` field by field
(MSA block and deletion matrices included), and the model run on them must reproduce
DeepMind's outputs. Cases without an AlphaFold fixture (a heterotrimer with a repeated chain,
a chain with no paired rows) are compared with our own pairing of the same alignments."""

from __future__ import annotations

import csv
import re
import shutil
from dataclasses import replace

import numpy as np
import pytest

from protdp.cli import main as protdp_main
from protdp.data.parse import parse_msa
from protdp.data.residues import GAP_ID
from protdp.errors import InputError
from protdp.complex import colabfold_a3m
from protdp.complex.colabfold_a3m import (chain_inputs_from_a3m, complex_a3m_from_chains,
                                           format_complex_a3m, parse_complex_a3m,
                                           read_complex_a3m, write_complex_a3m)
from protdp.complex.features import complex_features
from protdp.complex.pair_modes import PAIR_MODES, apply_pair_mode, query_msa
from test_multimer_model import model  # noqa: F401  (the imported fixture model, a fixture)
from test_complex_pairing import CASES, FIXTURE, RAW, _chain


def _chains(spec):
    return [_chain(cid, name, uni) for cid, (name, uni) in zip("ABC", spec)]


def _through_file(chains, path, mode="unpaired_paired"):
    """Write our inputs in ColabFold's layout, read the file back, build the features (the
    fixture's template dicts added back: a3m holds no templates)."""
    write_complex_a3m(path, complex_a3m_from_chains(chains))
    got = chain_inputs_from_a3m(read_complex_a3m(path), [(c.chain_id, c.sequence) for c in chains])
    got = [replace(g, templates=c.templates) for g, c in zip(got, chains)]
    return complex_features(apply_pair_mode(got, mode))


def _assert_equal_features(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for key in want:
        g, w = np.asarray(got[key]), np.asarray(want[key])
        assert g.shape == w.shape and g.dtype == w.dtype, (key, g.shape, w.shape, g.dtype, w.dtype)
        assert np.array_equal(g, w), key


@pytest.mark.parametrize("name", sorted(CASES))
def test_alphafold_pairing_written_as_colabfold_a3m_gives_alphafold_features(name, tmp_path):
    chains = _chains(CASES[name])
    out = _through_file(chains, tmp_path / f"{name}.a3m")
    ref = np.load(FIXTURE / f"features_{name}.npz")
    _assert_equal_features(out.features, {k: ref[k] for k in ref.files})
    lines = (tmp_path / f"{name}.a3m").read_text().splitlines()
    if name.startswith("2p90"):                     # homomer: one chain, two copies
        assert lines[0] == "#45\t2" and lines[1] == ">101" and out.report["paired"] is False
    else:                                           # 23 paired rows: queries + 22 species
        assert lines[0] == "#36,40\t1,1" and lines[1] == ">101\t102"
        assert len(out.report["paired_rows"]) == 23
        assert out.report["pairing_source"].startswith("given")
        assert sum(ln.startswith(">101") for ln in lines) == 2      # paired + A's unpaired


def test_heterotrimer_with_a_repeated_chain_equals_our_pairing(tmp_path):
    """A, B, A' (ColabFold: '#36,40<TAB>2,1'). B's pairing alignment cut to its first half so
    that some species are found in the two copies of A only: AlphaFold pairs those rows across
    the copies with a gap row for B; they must stay paired through the file."""
    a, b, c = _chains([("hbA_1-36", True), ("hbB_1-40", True), ("hbA_1-36", True)])
    sto = b.uniprot
    b = replace(b, uniprot=replace(sto, sequences=sto.sequences[:40],
                                   deletion_matrix=sto.deletion_matrix[:40], names=sto.names[:40]))
    chains = [a, b, c]
    ours = complex_features(chains)
    got = _through_file(chains, tmp_path / "a2b.a3m")
    _assert_equal_features(got.features, ours.features)
    assert (tmp_path / "a2b.a3m").read_text().startswith("#36,40\t2,1\n>101\t102\n")
    f = ours.features
    paired = f["msa"][: len(ours.report["paired_rows"])]
    b_cols = f["asym_id"] == 3                                     # assembly order A, A', B
    a_only = (paired[:, b_cols] == GAP_ID).all(axis=1)
    assert a_only.sum() > 0                  # rows AlphaFold paired across the copies of A only
    assert np.array_equal(paired[:, f["asym_id"] == 1], paired[:, f["asym_id"] == 2])


def test_chain_with_no_paired_rows(tmp_path):
    """A third chain whose pairing alignment has no species: its part of every paired row but
    the queries' is a gap row; features through the file equal our pairing's."""
    a, b, p = _chains([("hbA_1-36", True), ("hbB_1-40", True), ("2p90_A02", False)])
    p = replace(p, uniprot=query_msa(p.sequence))
    ours = complex_features([a, b, p])
    got = _through_file([a, b, p], tmp_path / "abp.a3m")
    _assert_equal_features(got.features, ours.features)
    n_pair = len(ours.report["paired_rows"])
    block = ours.features["msa"][:n_pair, ours.features["asym_id"] == 3]
    assert n_pair == 23 and (block[1:] == GAP_ID).all() and (block[0] != GAP_ID).all()
    assert all(r["names"]["C"] is None for r in got.report["paired_rows"][1:])


def test_model_on_features_from_the_colabfold_file_matches_alphafold(model, tmp_path,  # noqa: F811
                                                                     monkeypatch):
    """`weights compare`'s check for the multimer fixture, in-process (the CLI form is
    tests/test_weights_compare_multimer.py): the features read from the ColabFold file,
    AlphaFold's recorded MSA sampling, AlphaFold's outputs; the tolerances of
    tests/test_multimer_model.py."""
    import torch

    from test_multimer_model import _alphafold_unit_diagonal, _diff

    name = "4hhb_hbA1-36_hbB1-40"
    feats = _through_file(_chains(CASES[name]), tmp_path / "hb.a3m").features
    f = {k: torch.from_numpy(np.asarray(v)) for k, v in feats.items()}
    rec = np.load(FIXTURE / f"sampled_msa_{name}.npz")
    ref = np.load(FIXTURE / f"outputs_{name}.npz")
    _alphafold_unit_diagonal(monkeypatch, name, f)
    with torch.no_grad():
        out = model(f, orders=[torch.from_numpy(o).long() for o in rec["index_order"]])
    assert _diff(out["final_atom_positions"], ref["structure_module/final_atom_positions"]) < 1e-3
    assert _diff(out["plddt"], ref["confidence/plddt"]) < 1e-2
    assert _diff(out["iptm"], ref["confidence/iptm"]) < 1e-4
    assert _diff(out["ptm"], ref["confidence/ptm"]) < 1e-4


def test_colabfold_written_by_colabfold_rules_is_read(tmp_path):
    """A file laid out as ColabFold's `msa_to_str` writes it, by hand: the paired query row
    '>101<TAB>102', a paired row with insertions (lower case) in both chains, then each chain's
    unpaired rows padded with gaps; the parts split at the header's lengths."""
    text = ("#4,3\t1,1\n>101\t102\nMKVLGSH\n>ua\tub\nMaKV-GsSA\n"
            ">101\nMKVL---\n>a1\nMRVLccc---\n>102\n----GSH\n>b1\n----GTH\n>b1\n----GTH\n")
    a3m = parse_complex_a3m(text, "t.a3m")
    assert a3m.queries == ["MKVL", "GSH"] and a3m.cardinality == [1, 1]
    pa, pb = a3m.paired
    assert pa.sequences == ["MKVL", "MKV-"] and pb.sequences == ["GSH", "GSA"]
    assert pa.deletion_matrix.tolist() == [[0] * 4, [0, 1, 0, 0]]
    assert pb.deletion_matrix.tolist() == [[0] * 3, [0, 1, 0]] and pb.names == ["102", "ub"]
    ua, ub = a3m.unpaired
    assert ua.sequences == ["MKVL", "MRVL"] and ub.sequences == ["GSH", "GTH"]   # deduplicated
    assert ua.deletion_matrix.tolist() == [[0] * 4, [0] * 4]     # trailing insertions: B's
    back = parse_complex_a3m(format_complex_a3m(a3m), "u.a3m")
    for m, n in zip(a3m.paired + a3m.unpaired, back.paired + back.unpaired):
        assert m.sequences == n.sequences and np.array_equal(m.deletion_matrix, n.deletion_matrix)
    # ColabFold's `unpaired` mode writes no paired block: the queries' row is then the paired
    # block (as ColabFold feeds the model), each chain's rows unpaired
    flat = parse_complex_a3m("#4,3\t1,1\n>101\nMKVL---\n>a1\nMRVL---\n>102\n----GSH\n", "v")
    assert flat.paired is None and [m.sequences for m in flat.unpaired] == [["MKVL", "MRVL"],
                                                                             ["GSH"]]
    ins = chain_inputs_from_a3m(flat, [("A", "MKVL"), ("B", "GSH")])
    assert [i.paired.sequences for i in ins] == [["MKVL"], ["GSH"]]
    f = complex_features(ins).features
    assert int(f["num_alignments"]) == 2 and f["msa"][1, 4:].tolist() == [GAP_ID] * 3
    # a homomer as ColabFold writes it: the query twice (paired block of one row, then the
    # unpaired block), read once; the copies side by side (AlphaFold merges a homomer densely)
    homo = parse_complex_a3m("#4\t3\n>101\nMKVL\n>101\nMKVL\n>h\nMRVL\n", "h")
    assert homo.paired is None and homo.unpaired[0].sequences == ["MKVL", "MRVL"]
    f = complex_features(chain_inputs_from_a3m(homo, [("A", "MKVL")] * 3)).features
    assert int(f["num_alignments"]) == 2 and f["asym_id"].tolist() == [1] * 4 + [2] * 4 + [3] * 4


def _layouts(tmp_path):
    """The heterodimer twice: our folder layout (species pairing here) and ColabFold's file."""
    fasta = tmp_path / "in"
    fasta.mkdir()
    (fasta / "hb.fasta").write_text((RAW / "4hhb_hbA1-36_hbB1-40.fasta").read_text())
    ours, cf = tmp_path / "ours", tmp_path / "cf"
    for cid, name in (("A", "hbA_1-36"), ("B", "hbB_1-40")):
        (ours / f"hb_{cid}" / "stockholm").mkdir(parents=True)
        shutil.copy(RAW / f"{name}.a3m", ours / f"hb_{cid}" / "bfd.a3m")
        shutil.copy(RAW / f"{name}.uniprot_hits.sto",
                    ours / f"hb_{cid}" / "stockholm" / "uniprot.sto")
    cf.mkdir()
    chains = _chains(CASES["4hhb_hbA1-36_hbB1-40"])
    write_complex_a3m(cf / "hb.a3m", complex_a3m_from_chains(chains))
    return fasta, ours, cf, chains


@pytest.mark.parametrize("mode", PAIR_MODES)
def test_pair_modes_same_for_our_search_and_a_colabfold_file(mode, tmp_path, capsys):
    """`protdp complex features --pair-mode`: our own MSA folders (species pairing) and the
    ColabFold file holding the same rows give the same features in every mode; the modes keep
    what ColabFold's do (unpaired: the queries' row + every chain's own rows; paired: the
    paired rows only)."""
    fasta, ours, cf, chains = _layouts(tmp_path)
    feats = {}
    for label, msa_dir in (("ours", ours), ("cf", cf)):
        assert protdp_main(["complex", "features", "--fasta", str(fasta), "--msa-dir",
                            str(msa_dir), "--out", str(tmp_path / label), "--pair-mode",
                            mode]) == 0, capsys.readouterr()
        feats[label] = dict(np.load(tmp_path / label / "hb" / "features.npz"))
    _assert_equal_features(feats["cf"], feats["ours"])
    depth = int(feats["ours"]["num_alignments"])
    own = [c.msa.depth - 1 for c in chains]             # each chain's rows but its query
    if mode == "unpaired":
        assert depth == 1 + sum(own)
    elif mode == "paired":
        assert depth == 23
    else:
        ref = np.load(FIXTURE / "features_4hhb_hbA1-36_hbB1-40.npz")
        assert depth == int(ref["num_alignments"]) == 323


def test_unpaired_mode_needs_no_pairing_alignment(tmp_path):
    fasta, ours, _, _ = _layouts(tmp_path)
    for cid in "AB":
        shutil.rmtree(ours / f"hb_{cid}" / "stockholm")
    assert protdp_main(["complex", "features", "--fasta", str(fasta), "--msa-dir", str(ours),
                        "--out", str(tmp_path / "o"), "--pair-mode", "unpaired"]) == 0
    assert protdp_main(["complex", "features", "--fasta", str(fasta), "--msa-dir", str(ours),
                        "--out", str(tmp_path / "o2")]) == 1            # pairing needs it


def _bad_files(cf_text: str) -> dict[str, tuple[str, str]]:
    """complex id -> (file text, expected 'line: problem' regex)."""
    lines = cf_text.split("\n")
    paired_row = next(i for i, ln in enumerate(lines) if ln.startswith(">tr|"))
    short = list(lines)
    short[paired_row + 1] = short[paired_row + 1][:-1]             # one column too few
    wrong_res = list(lines)
    wrong_res[2] = "W" + wrong_res[2][1:]
    return {
        "hdr_len": ("\n".join(["#36,41\t1,1"] + lines[1:]),
                    r":1: cardinality header '#36,41\t1,1' does not match the complex: its "
                    r"chain 2 should be chain B \(40 aa"),
        "hdr_query": ("\n".join(wrong_res),
                      r":3: the query row of chain 1 \('>101'\) is not chain A's sequence: "
                      r"residue 1 is W in the file, V in the FASTA"),
        "row_len": ("\n".join(short),
                    rf":{paired_row + 2}: row 'tr\|.*' has 75 aligned columns \(upper-case "
                    r"letters and '-'\); the header's chains need 76 \(36\+40\)"),
        "no_header": ("\n".join(lines[1:]),
                      r":1: not a ColabFold complex a3m: the first line must be the "
                      r"cardinality header"),
        "big": (cf_text + cf_text[cf_text.index("\n>101\n") + 1:] * 3,
                r": file is [0-9,]+ bytes, over the [0-9,]+-byte limit for a complex a3m"),
    }


def test_bad_files_are_one_line_each_and_the_batch_goes_on(tmp_path, capsys, monkeypatch):
    """Header not matching the query (a length, a residue), a paired row of the wrong length,
    no header, a chain missing from the header (a trimer given a dimer's file), a file over the
    size limit: one line each naming the file and line in complex_features.tsv (and stderr);
    the good complex is built."""
    fasta, _, cf, _ = _layouts(tmp_path)
    good = (cf / "hb.a3m").read_text()
    hb = (RAW / "4hhb_hbA1-36_hbB1-40.fasta").read_text()
    bad = _bad_files(good)
    for cid, (text, _) in bad.items():
        (fasta / f"{cid}.fasta").write_text(hb)
        (cf / f"{cid}.a3m").write_text(text)
    p_seq = parse_msa(RAW / "2p90_A02.a3m").query
    (fasta / "missing.fasta").write_text(hb + f">C\n{p_seq}\n")
    (cf / "missing.a3m").write_text(good)
    monkeypatch.setattr(colabfold_a3m, "MAX_COMPLEX_A3M_BYTES", len(good.encode()) + 100)
    rc = protdp_main(["complex", "features", "--fasta", str(fasta), "--msa-dir", str(cf),
                      "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 0
    with open(tmp_path / "out" / "complex_features.tsv") as fh:
        rows = {r["complex"]: r for r in csv.DictReader(fh, delimiter="\t")}
    assert rows["hb"]["status"] == "ok" and rows["hb"]["paired_rows"] == "23"
    for cid, (_, pattern) in bad.items():
        detail = rows[cid]["detail"]
        assert rows[cid]["status"] == "error" and "\n" not in detail, cid
        assert re.match(re.escape(str(cf / f"{cid}.a3m")) + pattern, detail), (cid, detail)
        assert f"rejected: {cid}: {detail}" in err
    assert re.match(re.escape(str(cf / "missing.a3m")) + r":1: chain C \(45 aa, 1 copy\) is "
                    r"missing from the cardinality header '#36,40\t1,1' \(the complex's is "
                    r"'#36,40,45\t1,1,1'\)", rows["missing"]["detail"]), rows["missing"]


def test_reader_errors_name_the_line():
    with pytest.raises(InputError, match=r"t.a3m:7: row 'b1' has residues of chains 1 and 2 "
                                         r"but lies among the unpaired rows \(after line 5\)"):
        parse_complex_a3m("#2,2\t1,1\n>101\t102\nMKGS\n>101\nMK--\n>b1\nMKGS\n", "t.a3m")
    with pytest.raises(InputError, match=r"t.a3m:3: unexpected character '\*'"):
        parse_complex_a3m("#2,2\t1,1\n>101\t102\nMK*S\n", "t.a3m")
    with pytest.raises(InputError, match=r"t.a3m:2: record 'x' has no sequence"):
        parse_complex_a3m("#2,2\t1,1\n>x\n>y\nMKGS\n", "t.a3m")


def test_predict_reads_the_colabfold_file_per_complex(tmp_path):
    """`protdp predict`'s complex inputs (`build_features`): a complex with `<complex>.a3m`
    is read from it, another in the same --msa-dir from its folders."""
    from protdp.inference.complexes import build_features
    from protdp.complex.inputs import read_complexes

    fasta, ours, cf, chains = _layouts(tmp_path)
    shutil.copytree(ours, cf, dirs_exist_ok=True)
    for other in ("hb2", "hb3"):
        (fasta / f"{other}.fasta").write_text((fasta / "hb.fasta").read_text())
    for cid in "AB":
        shutil.move(cf / f"hb_{cid}", cf / f"hb2_{cid}")
    _write_user_pairing(cf / "hb3", chains)
    built = {t.complex_id: build_features(t, cf, max_length=1000, max_unknown_fraction=0.5)
             for t in read_complexes(fasta)}
    assert [p.name for p in built["hb"]["files"]] == ["hb.a3m"]
    assert {p.name for p in built["hb2"]["files"]} == {"bfd.a3m", "uniprot.sto"}
    assert [p.parent.name for p in built["hb3"]["files"]] == ["paired", "unpaired"] * 2
    for other in ("hb2", "hb3"):
        _assert_equal_features(built["hb"]["features"], built[other]["features"])
    # the gate's MSA depth and the coverage count the rows the model gets, whatever the mode:
    # in `paired` mode the 23 paired rows (each chain's unpaired MSA is its query alone)
    hb = next(t for t in read_complexes(fasta) if t.complex_id == "hb")
    paired = build_features(hb, cf, max_length=1000, max_unknown_fraction=0.5,
                            pair_mode="paired")
    assert paired["msa_depth"] == 23 and max(paired["coverage"]) == 23
    assert len(paired["coverage"]) == 76 and min(paired["coverage"]) >= 1
    msa = built["hb"]["features"]["msa"][:323]
    assert built["hb"]["msa_depth"] == min(int((msa[:, :36] != GAP_ID).any(1).sum()),
                                           int((msa[:, 36:] != GAP_ID).any(1).sum()))


def test_predict_parser_takes_the_pair_mode(capsys):
    from protdp.inference.cli import build_parser
    from protdp.inference.predictor import LATER_SETTINGS, PredictConfig

    base = ["--checkpoint", "c", "--fasta", "f", "--out", "o"]
    assert build_parser().parse_args(base).pair_mode == "unpaired_paired"
    assert build_parser().parse_args(base + ["--pair-mode", "paired"]).pair_mode == "paired"
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--pair-mode", "pairwise"])
    assert "invalid choice: 'pairwise'" in capsys.readouterr().err
    # the default leaves resume fingerprints of older prediction folders unchanged
    assert LATER_SETTINGS["pair_mode"] == PredictConfig().pair_mode


def test_msa_search_writes_colabfold_a3m_that_gives_the_same_features(tmp_path, capsys):
    """`protdp msa search --complexes --format colabfold`: <out>/<complex>.a3m for the
    heterodimer and the homodimer; `protdp complex features` from a folder holding only those
    files equals the features from the search's per-chain folders."""
    import random

    from test_complex_search import _records

    rng = random.Random(0)
    records = _records("hbA_1-36") + _records("hbB_1-40")
    decoys = [(f"decoy{i}", "".join(rng.sample(s, len(s)))) for i, (_, s) in enumerate(records)]
    db = tmp_path / "uniprot.fasta"
    db.write_text("".join(f">{n}\n{s}\n" for n, s in records + decoys))
    uniref = tmp_path / "uniref90.fasta"
    uniref.write_text(db.read_text())
    qa, qb = (parse_msa(RAW / f"{c}.a3m").query for c in ("hbA_1-36", "hbB_1-40"))
    fasta = tmp_path / "complexes.fasta"
    fasta.write_text(f">hb\n{qa}:{qb}\n>homo\n{qa}:{qa}\n")
    out = tmp_path / "msas"
    assert protdp_main(["msa", "search", "--complexes", "--fasta", str(fasta), "--db", str(db),
                        "--db", str(uniref), "--out", str(out), "--iterations", "1",
                        "--max-sequences", "50000", "--no-progress", "--search-workers", "1",
                        "--format", "colabfold"]) == 0, capsys.readouterr()
    assert (out / "hb.a3m").read_text().startswith(f"#{len(qa)},{len(qb)}\t1,1\n>101\t102\n")
    assert (out / "homo.a3m").read_text().startswith(f"#{len(qa)}\t2\n>101\n{qa}\n")
    only = tmp_path / "only_a3m"
    only.mkdir()
    for name in ("hb", "homo"):
        shutil.move(out / f"{name}.a3m", only / f"{name}.a3m")
    for label, msa_dir in (("folders", out), ("colabfold", only)):
        assert protdp_main(["complex", "features", "--fasta", str(fasta), "--msa-dir",
                            str(msa_dir), "--out", str(tmp_path / label)]) == 0
    for name in ("hb", "homo"):
        want = dict(np.load(tmp_path / "folders" / name / "features.npz"))
        _assert_equal_features(dict(np.load(tmp_path / "colabfold" / name / "features.npz")),
                               want)
    assert int(want["num_alignments"]) > 1
    capsys.readouterr()
    assert protdp_main(["msa", "search", "--fasta", str(fasta), "--db", str(db), "--out",
                        str(out), "--format", "colabfold"]) == 2
    assert capsys.readouterr().err.strip() == ("protdp msa: error: --format colabfold writes "
                                               "complexes' a3m: add --complexes")


def _write_user_pairing(folder, chains, *, unpaired=True):
    """Our species pairing of `chains` as the user's per-chain paired files (row i of every
    file together; gap-only rows marked '>no_partner'), their a3m as unpaired files."""
    from protdp.complex.colabfold_a3m import a3m_row
    from protdp.complex.pairing import species_paired_msas

    (folder / "paired").mkdir(parents=True)
    (folder / "unpaired").mkdir()
    for c, m in zip(chains, species_paired_msas([c.uniprot for c in chains])):
        text = "".join(f">{n or 'no_partner'}\n{a3m_row(s, d)}\n"
                       for n, s, d in zip(m.names, m.sequences, m.deletion_matrix))
        (folder / "paired" / f"{c.chain_id}.a3m").write_text(text)
        if unpaired:
            src = [p for p in c.msa.sources if p.endswith(".a3m")][0]
            shutil.copy(src, folder / "unpaired" / f"{c.chain_id}.a3m")


def test_user_paired_files_give_alphafold_features(tmp_path):
    """Deliverable 3: AlphaFold's pairing of the fixture as the user's own paired files (one
    per chain, row order = pairing) + unpaired a3m per chain -> DeepMind's features (the
    fixture's templates added back); a heterotrimer whose third chain has no partner in any
    row (gap rows '>no_partner') equals our pairing."""
    from protdp.complex.given_msas import given_complex_inputs

    name = "4hhb_hbA1-36_hbB1-40"
    chains = _chains(CASES[name])
    _write_user_pairing(tmp_path / "hb", chains)
    got, files = given_complex_inputs(tmp_path, "hb", [(c.chain_id, c.sequence) for c in chains])
    assert [f.name for f in files] == ["A.a3m", "A.a3m", "B.a3m", "B.a3m"]
    got = [replace(g, templates=c.templates) for g, c in zip(got, chains)]
    ref = np.load(FIXTURE / f"features_{name}.npz")
    _assert_equal_features(complex_features(got).features, {k: ref[k] for k in ref.files})

    a, b, p = _chains([("hbA_1-36", True), ("hbB_1-40", True), ("2p90_A02", False)])
    p = replace(p, uniprot=query_msa(p.sequence))
    _write_user_pairing(tmp_path / "abp", [a, b, p])
    text = (tmp_path / "abp" / "paired" / "C.a3m").read_text()
    assert text.count(">no_partner\n" + "-" * len(p.sequence) + "\n") == 22
    got, _ = given_complex_inputs(tmp_path, "abp", [(c.chain_id, c.sequence) for c in (a, b, p)])
    got = [replace(g, templates=c.templates) for g, c in zip(got, (a, b, p))]
    _assert_equal_features(complex_features(got).features, complex_features([a, b, p]).features)


def test_user_paired_files_bad_rows_are_one_line(tmp_path):
    from protdp.complex.given_msas import given_complex_inputs

    chains = _chains(CASES["4hhb_hbA1-36_hbB1-40"])
    ids = [(c.chain_id, c.sequence) for c in chains]
    folder = tmp_path / "hb"
    _write_user_pairing(folder, chains, unpaired=False)
    b = folder / "paired" / "B.a3m"
    good = b.read_text()
    b.write_text(good + ">extra\n" + "-" * len(chains[1].sequence) + "\n")
    with pytest.raises(InputError, match=re.escape(str(b)) + r": 24 rows, chain A's paired "
                                         r"file has 23: row i of every chain's file"):
        given_complex_inputs(tmp_path, "hb", ids)
    lines = good.split("\n")
    lines[5] = lines[5] + "A"
    b.write_text("\n".join(lines))
    with pytest.raises(InputError, match=re.escape(str(b)) + r":6: row '.*' has 41 aligned "
                                         r"columns \(upper-case letters and '-'\); the chain's "
                                         r"query has 40$"):
        given_complex_inputs(tmp_path, "hb", ids)
    b.write_text("\n".join(good.split("\n")[2:]))
    with pytest.raises(InputError, match=re.escape(str(b)) + r":2: row 0 \('.*'\) is not the "
                                         r"chain's query sequence"):
        given_complex_inputs(tmp_path, "hb", ids)
    b.unlink()
    with pytest.raises(InputError, match=r"chain B: no paired file B.a3m"):
        given_complex_inputs(tmp_path, "hb", ids)
    # without unpaired files every chain's unpaired MSA is its query alone
    b.write_text(good)
    got, _ = given_complex_inputs(tmp_path, "hb", ids)
    assert [g.msa.depth for g in got] == [1, 1] and [g.paired.depth for g in got] == [23, 23]


def test_protdp_predict_with_a_colabfold_file_and_a_pair_mode(tmp_path, capsys):
    """`protdp predict --msa-dir` holding `<complex>.a3m` (and a bad one beside it) with
    `--pair-mode paired`: the good complex is predicted exactly as `complex features
    --pair-mode paired` + `complex predict` predict it from the search folders; the bad file
    is its complex's one line and the batch goes on."""
    import json

    from protdp.inference.writers import read_summary
    from test_complex_predict import COMMON

    ckpt = tmp_path / "mm1"
    assert protdp_main(["weights", "import", "--format", "alphafold",
                        str(FIXTURE / "params" / "params_model_1_multimer_v3_small.npz"),
                        "--out", str(ckpt), "--alphafold-config",
                        str(FIXTURE / "config_model_1_multimer_v3_small.json")]) == 0
    fasta_dir, ours, cf, _ = _layouts(tmp_path)
    fasta = tmp_path / "two.fasta"
    hb = (fasta_dir / "hb.fasta").read_text().split(">")[1:]
    seqs = ["".join(r.split("\n")[1:]) for r in hb]
    fasta.write_text(f">hb\n{seqs[0]}:{seqs[1]}\n>bad\n{seqs[0]}:{seqs[1]}\n")
    (cf / "bad.a3m").write_text("#36,41\t1,1\n" + (cf / "hb.a3m").read_text().split("\n", 1)[1])
    out = tmp_path / "out"
    assert protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta),
                        "--msa-dir", str(cf), "--out", str(out), "--pair-mode", "paired",
                        *COMMON]) == 0
    rows = {r["target"]: r for r in read_summary(out / "summary.tsv")}
    assert rows["bad"]["route"] == "rejected"
    assert rows["bad"]["detail"].startswith(f"{cf / 'bad.a3m'}:1: cardinality header")
    pdir = out / "targets" / "hb" / (out / "targets" / "hb" / "CURRENT").read_text().strip()
    scores = json.loads((pdir / "scores.json").read_text())
    assert protdp_main(["complex", "features", "--fasta", str(fasta_dir), "--msa-dir", str(ours),
                        "--out", str(tmp_path / "feats"), "--pair-mode", "paired"]) == 0
    assert int(np.load(tmp_path / "feats" / "hb" / "features.npz")["num_alignments"]) == 23
    assert protdp_main(["complex", "predict", "--features-dir", str(tmp_path / "feats"),
                        "--checkpoint", str(ckpt), "--out", str(tmp_path / "ref"),
                        "--num-recycles", "0", "--allow-unreleased"]) == 0
    capsys.readouterr()
    tdir = tmp_path / "ref" / "targets" / "hb"        # `protdp predict`'s layout (issue 41)
    ref = json.loads((tdir / (tdir / "CURRENT").read_text().strip() / "scores.json").read_text())
    assert ref["iptm"] == scores["iptm"] and ref["plddt"] == scores["plddt"]


def test_real_colabfold_file_as_a_homodimer(tmp_path):
    """A real ColabFold a3m (`msa/4hhb_B.colabfold.a3m`, HBB with the MMseqs2 server's
    UniRef100 rows and tab-separated m8 fields in the headers, '#147<TAB>1'): with its header
    saying two copies it is HBB's homodimer, and its features equal those of the same file read
    as each chain's MSA by our a3m reader; with its own one-copy header it does not fit the
    dimer (one line naming line 1)."""
    from protdp.data.parse import parse_msa as read_msa
    from protdp.complex.features import ChainInput
    from protdp.paths import data_root

    src = data_root() / "msa" / "4hhb_B.colabfold.a3m"
    text = src.read_text()
    assert text.startswith("#147\t1\n>101\n")
    msa = read_msa(src)
    chains = [("A", msa.query), ("B", msa.query)]
    dimer = tmp_path / "hbb2.a3m"
    dimer.write_text("#147\t2\n" + text.split("\n", 1)[1])
    got = chain_inputs_from_a3m(read_complex_a3m(dimer, chains=chains), chains)
    assert got[0].msa.depth == msa.depth > 4000
    want = complex_features([ChainInput(c, s, msa) for c, s in chains]).features
    _assert_equal_features(complex_features(got).features, want)
    with pytest.raises(InputError, match=re.escape(str(src)) + r":1: cardinality header "
                                         r"'#147\t1' does not match the complex: its chain 1 "
                                         r"should be chain A \(147 aa, 2 copies\)"):
        read_complex_a3m(src, chains=chains)
