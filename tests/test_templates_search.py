"""Template search and featurization as AlphaFold v2.3.2 does them (issue 31 D1-D2), on the
fixture's raw inputs (`af2_reference/templates/raw_inputs`: queries, MSAs, a pdb_seqres-style
database with one synthetic edit, AlphaFold's hmmsearch hits and template feature dicts):

- pyhmmer's search gives HMMER's own `hmmbuild --hand` + `hmmsearch -A` result (binary run
  here on the same inputs) and AlphaFold's stored `pdb_hits.sto`, row for row;
- protdp's featurizer gives AlphaFold's template dicts bit for bit (query duplicates rejected,
  a kalign realignment, a gapped template, a date-filtered hit, the zero-template placeholder);
- bad inputs are one clear error naming the file, and `protdp msa search --templates-db` goes on.
"""

import datetime as dt
import json
import shutil
import subprocess

import numpy as np
import pytest

from model_fixtures import af2_reference  # noqa: F401
from protdp.errors import InputError
from protdp.templates.featurize import Featurizer, parse_obsolete
from protdp.templates.hits import parse_hits, stockholm_rows
from protdp.templates.mmcif import read_structure
from protdp.templates.run import a3m_to_search_stockholm
from protdp.templates.search import HMMSEARCH_OPTIONS, search_templates

CASES = ("4hhb_A_1-64", "4hhb_B_1-61", "2q2k_A")


@pytest.fixture(scope="module")
def raw(af2_reference):  # noqa: F811
    return af2_reference / "templates" / "raw_inputs"


@pytest.fixture(scope="module")
def summary(af2_reference):  # noqa: F811
    return json.loads((af2_reference / "templates" / "summary.json").read_text())["cases"]


def _query(raw, case):
    return "".join(l.strip() for l in (raw / f"{case}.fasta").read_text().splitlines()
                   if not l.startswith(">"))


@pytest.mark.parametrize("case", CASES)
def test_search_equals_the_hmmsearch_binary_and_alphafold(raw, case, tmp_path):
    msa = tmp_path / "query.sto"
    msa.write_text(a3m_to_search_stockholm((raw / f"{case}.a3m").read_text()))
    ours = stockholm_rows(search_templates(msa, raw / "pdb_seqres.txt"))
    hmm, out = tmp_path / "q.hmm", tmp_path / "out.sto"
    subprocess.run(["hmmbuild", "--hand", "--amino", str(hmm), str(msa)], check=True,
                   capture_output=True)
    flags = [x for k, v in HMMSEARCH_OPTIONS.items()
             for x in ((f"--{k}" if len(k) > 1 else f"-{k}"), str(v))]
    subprocess.run(["hmmsearch", "--noali", "--cpu", "1", *flags, "-A", str(out), str(hmm),
                    str(raw / "pdb_seqres.txt")], check=True, capture_output=True)
    binary = stockholm_rows(out.read_text())
    alphafold = stockholm_rows((raw / f"{case}.pdb_hits.sto").read_text())
    assert [r[0] for r in ours] == [r[0] for r in binary] and ours == binary == alphafold
    assert len(ours) >= 2


def test_search_order_equals_the_binary_on_a_large_database(raw, tmp_path):
    """5,000 shuffled decoys: hundreds of near-threshold hits whose order hinges on the last
    digits of the scores (the HMM passes through HMMER's text format, as between the binaries)."""
    import random
    rng = random.Random(0)
    text = (raw / "pdb_seqres.txt").read_text()
    seqs = [r.split("\n", 1)[1].replace("\n", "") for r in text.split(">")[1:]]
    decoys = []
    for i in range(5000):
        s = list(rng.choice(seqs))
        rng.shuffle(s)
        decoys.append(f">{i // 26:03d}{chr(97 + i % 26)}_A mol:protein length:{len(s)}  DECOY\n"
                      + "".join(s))
    db = tmp_path / "pdb_seqres.txt"
    db.write_text(text.rstrip("\n") + "\n" + "\n".join(decoys) + "\n")
    msa = tmp_path / "query.sto"
    msa.write_text(a3m_to_search_stockholm((raw / "2q2k_A.a3m").read_text()))
    ours = stockholm_rows(search_templates(msa, db))
    subprocess.run(["hmmbuild", "--hand", "--amino", str(tmp_path / "q.hmm"), str(msa)],
                   check=True, capture_output=True)
    flags = [x for k, v in HMMSEARCH_OPTIONS.items()
             for x in ((f"--{k}" if len(k) > 1 else f"-{k}"), str(v))]
    subprocess.run(["hmmsearch", "--noali", "--cpu", "1", *flags, "-A", str(tmp_path / "o.sto"),
                    str(tmp_path / "q.hmm"), str(db)], check=True, capture_output=True)
    assert len(ours) > 200 and ours == stockholm_rows((tmp_path / "o.sto").read_text())


@pytest.mark.parametrize("case", CASES)
def test_features_equal_alphafold_bit_for_bit(raw, summary, case):
    query = _query(raw, case)
    hits = parse_hits((raw / f"{case}.pdb_hits.sto").read_text(), query)
    assert [(h.name, h.aligned_cols, h.hit_sequence) for h in hits] == \
        [(h["name"], h["aligned_cols"], h["hit_sequence"]) for h in summary[case]["hmmsearch_hits"]]
    cutoff = dt.date.fromisoformat(summary[case]["max_template_date"])
    result = Featurizer(raw / "mmcif", cutoff).get_templates(query, hits)
    want = np.load(raw / f"templates_{case}.npz")
    assert sorted(result.features) == sorted(want.files)
    for key in want.files:
        ours = result.features[key]
        ours = ours.astype("S") if ours.dtype == object else ours
        assert ours.dtype == want[key].dtype and ours.shape == want[key].shape, key
        assert np.array_equal(ours, want[key]), key
    assert result.warnings == summary[case]["featurizer_warnings"]
    assert result.errors == summary[case]["featurizer_errors"]
    names = [u["id"] + "_" + u["chain"] for u in result.used]
    assert names == [n.decode() for n in want["template_domain_names"] if n]


def test_date_cutoff_and_obsolete_ids(raw, tmp_path):
    query = _query(raw, "4hhb_A_1-64")
    hits = parse_hits((raw / "4hhb_A_1-64.pdb_hits.sto").read_text(), query)
    early = Featurizer(raw / "mmcif", dt.date(1990, 1, 1)).get_templates(query, hits)
    assert [u["id"] for u in early.used] == ["4hhb", "4hhb"]          # 102m (1998) filtered
    obsolete = tmp_path / "obsolete.dat"
    obsolete.write_text("LIST OF OBSOLETE COORDINATE ENTRIES AND SUCCESSORS\n"
                        "OBSLTE    30-SEP-03 102M\n")
    table = parse_obsolete(obsolete)
    assert table == {"102m": None}
    gone = Featurizer(raw / "mmcif", dt.date(2021, 11, 1), obsolete=table).get_templates(query, hits)
    assert "102m" not in [u["id"] for u in gone.used]
    assert "Hit 102m is obsolete." in gone.warnings


def test_bad_template_inputs_are_one_clear_error(raw, tmp_path):
    query = _query(raw, "4hhb_A_1-64")
    hits = parse_hits((raw / "4hhb_A_1-64.pdb_hits.sto").read_text(), query)
    with pytest.raises(InputError, match=r"102m.cif: mmCIF for template 102m not found"):
        mmcif = tmp_path / "mmcif"
        mmcif.mkdir()
        shutil.copy(raw / "mmcif" / "4hhb.cif", mmcif)
        Featurizer(mmcif, dt.date(2021, 11, 1)).get_templates(query, hits)
    junk = tmp_path / "junk.cif"
    junk.write_text("this is not a structure\n")
    with pytest.raises(InputError, match="junk.cif: not a readable mmCIF"):
        read_structure(junk)
    (tmp_path / "empty.cif").write_text("")              # was an IndexError traceback
    with pytest.raises(InputError, match="empty.cif: not a readable mmCIF file: no data block"):
        read_structure(tmp_path / "empty.cif")
    import gemmi
    assert read_structure(raw / "mmcif" / "4hhb.cif").release_date == dt.date(1984, 7, 17)
    dates = "_pdbx_audit_revision_history.revision_date"
    for value, expect in (("?", None), ("2020-99-01", "is not a date")):   # was a ValueError
        doc = gemmi.cif.read(str(raw / "mmcif" / "4hhb.cif"))              # traceback
        column = doc.sole_block().find_values(dates)
        for i in range(len(column)):
            column[i] = value
        doc.write_file(str(tmp_path / "d.cif"))
        if expect is None:
            assert read_structure(tmp_path / "d.cif").release_date is None
        else:
            with pytest.raises(InputError, match=f"d.cif: {dates} '{value}' {expect}"):
                read_structure(tmp_path / "d.cif")
    with pytest.raises(InputError, match=r"out.sto: hit 'x/1-5'"):
        parse_hits("# STOCKHOLM 1.0\n#=GS x/1-5 DE mol:protein length:5\nx/1-5 ACDEF\n//\n",
                   "ACDEF", "out.sto")


def test_msa_search_cli_writes_templates_beside_the_msas(raw, tmp_path, capsys):
    from protdp.msa import cli as msa_cli
    fasta = tmp_path / "t.fasta"
    fasta.write_text((raw / "2q2k_A.fasta").read_text() + ">bad\nXXXXXXXXXXXXXXXXXXX\n")
    out = tmp_path / "msas"
    from protdp.errors import ConfigError       # a template flag missing: refused before the
    with pytest.raises(ConfigError, match="needs --mmcif-dir"):    # MSA search, not after it
        msa_cli.main(["search", "--fasta", str(fasta), "--db", str(raw / "pdb_seqres.txt"),
                      "--out", str(out), "--no-progress", "--templates-db",
                      str(raw / "pdb_seqres.txt"), "--mmcif-dir", str(raw / "mmcif")])
    assert not out.exists()
    rc = msa_cli.main(["search", "--fasta", str(fasta), "--db", str(raw / "pdb_seqres.txt"),
                       "--out", str(out), "--no-progress", "--templates-db",
                       str(raw / "pdb_seqres.txt"), "--mmcif-dir", str(raw / "mmcif"),
                       "--max-template-date", "2021-11-01"])
    assert rc == 0
    target = next(p for p in out.iterdir() if p.is_dir())
    assert {"pdb_hits.sto", "templates.npz", "templates.json"} <= {p.name for p in target.iterdir()}
    record = json.loads((target / "templates.json").read_text())
    assert record["templates"] == []                       # the query itself: duplicates only
    with np.load(target / "templates.npz") as f:
        assert f["template_aatype"].shape == (1, 70, 22) and f["template_all_atom_masks"].sum() == 0
    assert "rejected" in capsys.readouterr().err             # the bad record, the batch went on


@pytest.mark.parametrize("case", CASES)
def test_model_inputs_equal_alphafold_processed_features(raw, af2_reference, case):  # noqa: F811
    """AlphaFold's template dict -> the model's template keys exactly as AlphaFold's input
    pipeline makes them (fix_templates_aatype, make_template_mask, first max_templates rows)."""
    from protdp.templates.inputs import model_inputs
    feats = dict(np.load(raw / f"templates_{case}.npz"))
    ours = model_inputs(feats, 4)
    want = np.load(af2_reference / "templates" / f"features_{case}.npz")
    T = ours["template_mask"].shape[0]
    assert np.array_equal(want["template_mask"][0][:T], ours["template_mask"].numpy())
    assert not want["template_mask"][0][T:].any()
    for key in ("template_aatype", "template_all_atom_positions", "template_all_atom_masks"):
        assert np.array_equal(want[key][0][:T], ours[key].numpy()), key
