"""AlphaFold2's and ColabFold's files in our prediction folders, read as those tools define
them (issue 41), checked against the model's own float32 outputs (`result_<m>.npz`).

References: AlphaFold v2.3 `run_alphafold.py` / `common/confidence.py` (confidence_<m>.json:
residueNumber / confidenceScore (2 decimals) / confidenceCategory D<50<=L<70<=M<90<=H;
pae_<m>.json: AFDB's one-element list, 1 decimal, `max_predicted_aligned_error` the bin cap;
unrelaxed_<m>.cif, ranked_<k>.cif; ranking_debug.json at full precision;
msas/chain_id_map.json {chain id: {description, sequence}}), ColabFold `batch.py`
(`<n>_scores_rank_NNN_<tag>.json` beside `<n>_unrelaxed_rank_NNN_<tag>.pdb`, tag
`<model type>_model_<N>_seed_<SSS>`, `max_pae` = `pae.max()`, `<n>_predicted_aligned_error_v1.json`
= {"predicted_aligned_error": scores pae, "max_predicted_aligned_error": scores max_pae}), the
AFDB's `AF-<id>-F1-predicted_aligned_error_v4.json`, and python-modelcif for the ModelCIF
(every ranked model, the PAE in `_ma_qa_metric_local_pairwise`, entity / asym unit ->
FASTA record). B-factor = pLDDT and ipTM are the same in every file.
"""

from __future__ import annotations

import csv
import json

import gemmi
import numpy as np
import pytest

from prediction_folders import CHAINS, complex_dir, monomer_dir, ours  # noqa: F401
from test_complex_predict import ckpt as multimer_ckpt  # noqa: F401  (fixture)

CAP = 31.75          # AlphaFold's largest PAE bin centre (the fixture models' 64 bins)


def _category(v: float) -> str:
    for cat, upper in (("D", 50), ("L", 70), ("M", 90)):
        if v < upper:
            return cat
    return "H"


def _bfactors(path) -> list[float]:
    """Every atom's B-factor, per residue the first (gemmi holds float32: 2 decimals back)."""
    st = gemmi.read_structure(str(path))
    assert all(at.b_iso == res[0].b_iso for ch in st[0] for res in ch for at in res)
    return [round(float(res[0].b_iso), 2) for ch in st[0] for res in ch]


@pytest.mark.parametrize("which", ["monomer", "complex"])
def test_alphafold2_per_model_files(which, monomer_dir, complex_dir):  # noqa: F811
    pdir = monomer_dir if which == "monomer" else complex_dir
    mine = ours(pdir)
    debug = json.loads((pdir / "ranking_debug.json").read_text())
    key = "plddts" if which == "monomer" else "iptm+ptm"
    assert debug["order"] == list(mine)
    for k, (name, m) in enumerate(mine.items()):
        # ranking_debug.json: full floats (the result file's float32 value, not 2 decimals)
        assert debug[key][name] == pytest.approx(float(m["ranking_confidence"]), abs=1e-5)
        assert debug["ptm"][name] == pytest.approx(float(m["ptm"]), abs=1e-7)
        plddt = np.round(m["plddt"].astype(np.float64), 2)
        conf = json.loads((pdir / f"confidence_{name}.json").read_text())
        assert conf == {"residueNumber": list(range(1, len(plddt) + 1)),
                        "confidenceScore": plddt.tolist(),
                        "confidenceCategory": [_category(v) for v in plddt]}
        (pae,) = json.loads((pdir / f"pae_{name}.json").read_text())
        assert pae["max_predicted_aligned_error"] == CAP
        np.testing.assert_array_equal(pae["predicted_aligned_error"],
                                      np.round(m["predicted_aligned_error"].astype(np.float64), 1))
        # structures: PDB and mmCIF, unrelaxed_<m> and ranked_<k>, B-factor = pLDDT exactly
        for f in (f"unrelaxed_{name}.pdb", f"unrelaxed_{name}.cif", f"ranked_{k}.pdb",
                  f"ranked_{k}.cif"):
            assert _bfactors(pdir / f) == plddt.tolist(), f
        a = gemmi.read_structure(str(pdir / f"ranked_{k}.cif"))
        b = gemmi.read_structure(str(pdir / f"unrelaxed_{name}.pdb"))
        np.testing.assert_allclose([at.pos.tolist() for ch in a[0] for r in ch for at in r],
                                   [at.pos.tolist() for ch in b[0] for r in ch for at in r],
                                   atol=1e-3)


def test_chain_id_map_of_a_complex(complex_dir, monomer_dir):  # noqa: F811
    doc = json.loads((complex_dir / "msas" / "chain_id_map.json").read_text())
    assert doc == {"A": {"description": "dimer chain A", "sequence": CHAINS[0]},
                   "B": {"description": "dimer chain B", "sequence": CHAINS[1]}}
    st = gemmi.read_structure(str(complex_dir / "dimer.pdb"))
    assert {ch.name: gemmi.one_letter_code([r.name for r in ch]).upper() for ch in st[0]} == \
        {c: d["sequence"] for c, d in doc.items()}
    assert not (monomer_dir / "msas").exists()         # AlphaFold writes it for multimer runs
    prov = json.loads((complex_dir / "provenance.json").read_text())
    assert "msas/chain_id_map.json" in prov["outputs_sha256"]


@pytest.mark.parametrize("which", ["monomer", "complex"])
def test_colabfold_names_and_content(which, monomer_dir, complex_dir):  # noqa: F811
    pdir = monomer_dir if which == "monomer" else complex_dir
    name = "mono" if which == "monomer" else "dimer"
    token = "alphafold2_ptm" if which == "monomer" else "alphafold2_multimer_v3"
    mine = ours(pdir)
    scores_files = sorted(pdir.glob(f"{name}_scores_rank_*.json"))
    assert len(scores_files) == len(mine)
    for k, (pred, m) in enumerate(mine.items()):
        tag = f"{token}_{pred}"
        assert m["colabfold_tag"] == tag
        cf = json.loads((pdir / f"{name}_scores_rank_{k + 1:03d}_{tag}.json").read_text())
        pdb = pdir / f"{name}_unrelaxed_rank_{k + 1:03d}_{tag}.pdb"
        assert _bfactors(pdb) == cf["plddt"]                   # the structure beside it
        raw = m["predicted_aligned_error"].astype(np.float64)
        assert cf["max_pae"] == pytest.approx(float(raw.max())) and cf["max_pae"] < CAP
        np.testing.assert_array_equal(cf["pae"], np.round(raw, 2))
        assert m["max_pae"] == round(cf["max_pae"], 2)        # scores.json's ensemble entry
        if k == 0:
            v1 = json.loads((pdir / f"{name}_predicted_aligned_error_v1.json").read_text())
            assert v1 == {"predicted_aligned_error": cf["pae"],
                          "max_predicted_aligned_error": cf["max_pae"]}
            (afdb,) = json.loads((pdir / f"AF-{name}-F1-predicted_aligned_error_v4.json")
                                 .read_text())
            assert afdb["max_predicted_aligned_error"] == CAP
            np.testing.assert_array_equal(afdb["predicted_aligned_error"], np.round(raw, 1))
    # summary.csv: max_pae the matrix maximum too, with the weights' name
    rows = list(csv.DictReader((pdir.parent.parent.parent / "summary.csv").open()))
    assert [(r["max_pae"], r["model_name"]) for r in rows] == \
        [(f"{m['max_pae']:.2f}", m["model_name"]) for m in mine.values()]


@pytest.mark.parametrize("which", ["monomer", "complex"])
def test_modelcif_every_ranked_model_pae_and_records(which, monomer_dir, complex_dir):  # noqa: F811
    import modelcif.qa_metric as qa
    import modelcif.reader

    pdir = monomer_dir if which == "monomer" else complex_dir
    name = "mono" if which == "monomer" else "dimer"
    mine = ours(pdir)
    with open(pdir / f"{name}.cif") as fh:
        (system,) = modelcif.reader.read(fh)
    models = [m for g in system.model_groups for m in g]
    assert len(models) == len(mine)                          # every ranked model, best first
    for k, (model, (pred, m)) in enumerate(zip(models, mine.items())):
        assert model.name.startswith(f"rank {k + 1}: {pred} ({m['model_name']})")
        by = {}
        for q in model.qa_metrics:
            by.setdefault(q.name, []).append(q)
        assert [q.value for q in by["pLDDT"] if isinstance(q, qa.Local)] == \
            np.round(m["plddt"].astype(np.float64), 2).tolist()
        # global scores: python-ihm writes floats with 3 decimals
        assert by["pTM"][0].value == pytest.approx(float(m["ptm"]), abs=5e-4 + 1e-9)
        if which == "complex":
            scores = json.loads((pdir / "scores.json").read_text())
            assert by["ipTM"][0].value == pytest.approx(scores["iptm"], abs=5e-4 + 1e-9)
            assert scores["iptm"] == round(float(m["iptm"]), 4)
        pairs = by.get("PAE", [])
        if k == 0:                                           # the top model's PAE matrix
            L = len(m["plddt"])
            got = np.zeros((L, L))
            offsets = {a.id: o for a, o in zip(system.asym_units, np.cumsum(
                [0] + [len(a.entity.sequence) for a in system.asym_units]))}
            for q in pairs:
                got[offsets[q.residue1.asym.id] + q.residue1.seq_id - 1,
                    offsets[q.residue2.asym.id] + q.residue2.seq_id - 1] = q.value
            assert len(pairs) == L * L
            np.testing.assert_allclose(got, np.round(m["predicted_aligned_error"]
                                                     .astype(np.float64), 2), atol=1e-9)
        else:
            assert pairs == []
    # chain -> entity -> FASTA record
    records = {"A": "mono the monomer record"} if which == "monomer" else \
        {"A": "dimer chain A", "B": "dimer chain B"}
    assert {a.id: a.entity.description for a in system.asym_units} == records
    assert all(records[a.id] in a.details for a in system.asym_units)


def test_weights_names_and_colabfold_tokens(tmp_path):
    """AlphaFold's model name from an import's provenance, ColabFold's model-type token, and
    protdp's name for its own checkpoints (the digest their release record binds)."""
    from protdp.inference.model_names import (alphafold_model_name, model_type_token,
                                              weights_name)

    def imported(source: str, fmt: str = "alphafold"):
        d = tmp_path / source.replace("/", "_")
        d.mkdir()
        (d / "provenance.json").write_text(json.dumps({"format": fmt, "source": source}))
        return d

    cases = {"/w/params_model_1.npz": ("model_1", "alphafold2"),
             "/w/params_model_2_ptm.npz": ("model_2_ptm", "alphafold2_ptm"),
             "params_model_3_ptm_small.npz": ("model_3_ptm", "alphafold2_ptm"),
             "/w/params_model_5_multimer_v2.npz": ("model_5_multimer_v2",
                                                   "alphafold2_multimer_v2")}
    for source, (name, token) in cases.items():
        fmt = "alphafold-multimer" if "multimer" in source else "alphafold"
        assert alphafold_model_name(imported(source, fmt) / "model.pt") == name
        assert model_type_token(name, "multimer" in name) == token
    assert alphafold_model_name(imported("/w/finetuned.pt", "openfold")) is None
    assert alphafold_model_name(tmp_path / "nothing_here") is None
    sha = "ab" * 32
    assert weights_name(tmp_path / "run" / "iter_5", sha) == "protdp_" + sha[:12]
    assert model_type_token("protdp_" + sha[:12], False) == "protdp"
    assert model_type_token("protdp_" + sha[:12], True) == "protdp_multimer"
