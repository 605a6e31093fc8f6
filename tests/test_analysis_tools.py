"""AlphaFold2 / ColabFold analysis tools read our prediction folders (issue 41).

alphajudge (AlphaFold2 layout: ranking_debug.json, pae_<m>.json, unrelaxed_<m>.cif) and
foldmetrics (ColabFold layout: `<n>_scores_rank_NNN_<tag>.json` beside
`<n>_unrelaxed_rank_NNN_<tag>.pdb`; AlphaFold2 JSON layout: confidence_<m>.json, pae_<m>.json)
are run on a monomer folder (imported `params_model_3_ptm`, two seeds) and a complex folder
(imported `params_model_1_multimer_v3`), and the numbers they report (pLDDT, pTM, ipTM, PAE,
ranking order, model names) must be ours: the result files (`result_<m>.npz`, the model's
float32 outputs) and scores.json. Skipped only when a tool is not installed (both are in the
`dev` extra). af_analysis (ColabFold layout through ColabFold's `log.txt`) is tested only where
it is installed: it is not in the `dev` extra (docs/prediction.md, "Read by AlphaFold2 and
ColabFold tools").
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from prediction_folders import complex_dir, monomer_dir, ours as _ours  # noqa: F401
from test_complex_predict import ckpt as multimer_ckpt  # noqa: F401  (fixture)


def _tool(name: str):
    return pytest.importorskip(name)

def test_model_names_say_which_weights(monomer_dir, complex_dir):
    mono, cplx = _ours(monomer_dir), _ours(complex_dir)
    assert set(mono) == {"model_3_seed_000", "model_3_seed_001"}    # not model_1: AF's number
    assert {e["model_name"] for e in mono.values()} == {"model_3_ptm"}
    assert {e["colabfold_tag"] for e in mono.values()} == {
        "alphafold2_ptm_model_3_seed_000", "alphafold2_ptm_model_3_seed_001"}
    assert [e["model_name"] for e in cplx.values()] == ["model_1_multimer_v3"]
    prov = json.loads((monomer_dir / "provenance.json").read_text())
    assert prov["checkpoints"][0]["model_name"] == "model_3_ptm"


@pytest.mark.parametrize("which", ["monomer", "complex"])
def test_alphajudge_reads_our_alphafold2_layout(which, monomer_dir, complex_dir):
    _tool("alphajudge")
    from alphajudge.parsers.af2 import AF2Parser

    pdir = monomer_dir if which == "monomer" else complex_dir
    ours = _ours(pdir)
    debug = json.loads((pdir / "ranking_debug.json").read_text())
    parser = AF2Parser()
    assert parser.detect(pdir)
    run = parser.parse_run(pdir)
    assert run.order == debug["order"] == [e for e in ours]           # best first
    for name in run.order:
        _, conf = run.load_model(name)
        mine = ours[name]
        pae = mine["predicted_aligned_error"].astype(np.float64)
        np.testing.assert_array_equal(conf.pae_matrix, np.round(pae, 1))  # AlphaFold's JSON
        assert conf.max_pae == pytest.approx(float(pae.max()), abs=0.05)
        np.testing.assert_allclose(conf.plddt_residue, mine["plddt"], atol=0.005 + 1e-6)
        assert conf.ptm == pytest.approx(float(mine["ptm"]), abs=1e-6)
        if which == "complex":
            assert conf.iptm == pytest.approx(float(mine["iptm"]), abs=1e-6)
            assert conf.iptm_ptm == pytest.approx(float(mine["ranking_confidence"]), abs=1e-6)


def test_alphajudge_command_scores_the_complex(complex_dir, tmp_path):
    """The console command (was: exit 0 with an empty CSV, 'No full PAE matrix')."""
    import shutil

    _tool("alphajudge")
    run = tmp_path / "run"
    shutil.copytree(complex_dir, run, ignore=shutil.ignore_patterns("msas"))
    summary = tmp_path / "aj.csv"
    done = subprocess.run([sys.executable, "-m", "alphajudge.cli", str(run), "-o", str(summary),
                           "--models_to_analyse", "all", "--skip_pae_png"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    import csv
    rows = list(csv.DictReader(summary.open()))
    (mine,) = _ours(complex_dir).values()
    assert len(rows) == 1 and rows[0]["model_used"] == mine["name"], rows
    assert float(rows[0]["iptm"]) == pytest.approx(float(mine["iptm"]), abs=1e-6)
    assert float(rows[0]["ptm"]) == pytest.approx(float(mine["ptm"]), abs=1e-6)


@pytest.mark.parametrize("which", ["monomer", "complex"])
def test_foldmetrics_reads_our_colabfold_and_alphafold2_layouts(which, monomer_dir,
                                                                 complex_dir):
    _tool("foldmetrics")
    from foldmetrics.api import evaluate, load_predictions

    pdir = monomer_dir if which == "monomer" else complex_dir
    ours = _ours(pdir)
    preds = load_predictions(pdir, on_error="raise")
    by_tool = {}
    for p in preds:
        by_tool.setdefault(p.tool, []).append(p)
    assert len(by_tool["colabfold"]) == len(by_tool["alphafold2"]) == len(ours)
    table = evaluate(pdir).set_index("model")
    for k, (name, mine) in enumerate(ours.items()):
        pae = mine["predicted_aligned_error"].astype(np.float64)
        cf = next(p for p in by_tool["colabfold"] if p.name.endswith(mine["colabfold_tag"]))
        assert f"_rank_{k + 1:03d}_" in cf.name
        assert cf.ptm == pytest.approx(float(mine["ptm"]), abs=5e-5)
        if which == "complex":
            assert cf.iptm == pytest.approx(float(mine["iptm"]), abs=5e-5)
        np.testing.assert_allclose(cf.pae, pae, atol=0.005 + 1e-6)
        assert cf.extras["max_pae"] == pytest.approx(float(pae.max()))
        af2 = next(p for p in by_tool["alphafold2"] if p.name == name)
        np.testing.assert_allclose(af2.pae, pae, atol=0.05 + 1e-6)
        for model in (cf.name, name):
            assert table.loc[model, "plddt_mean"] == pytest.approx(
                float(np.mean(mine["plddt"])), abs=0.005)


@pytest.mark.parametrize("which", ["monomer", "complex"])
def test_af_analysis_reads_our_colabfold_layout(which, monomer_dir, complex_dir, tmp_path):
    """af_analysis takes the folder for ColabFold's (log.txt), finds each model's structure and
    scores by its tag, and reports our pLDDT / pTM (3 significant digits, ColabFold's log) and
    our per-residue pLDDT, PAE and ipTM from the scores JSON."""
    import shutil

    af_analysis = _tool("af_analysis")
    pdir = monomer_dir if which == "monomer" else complex_dir
    run = tmp_path / "run"        # af_analysis reads the files of one folder, not msas/
    shutil.copytree(pdir, run, ignore=shutil.ignore_patterns("msas"))
    data = af_analysis.Data(str(run), verbose=False)
    assert data.format == "colabfold_1.5"
    mine = _ours(pdir)
    assert len(data.df) == len(mine)
    data.extract_fields(["plddt", "pae", "max_pae"] + (["iptm"] if which == "complex" else []),
                        disable=True)
    for _, row in data.df.iterrows():
        m = next(m for m in mine.values()
                 if m["colabfold_tag"] == f"{row['weight']}_model_{row['model']}_seed_"
                 f"{row['seed']:03d}")
        assert row["pdb"].endswith(f"_{m['colabfold_tag']}.pdb")
        assert row["pLDDT"] == pytest.approx(float(np.mean(m["plddt"])), rel=5e-3)
        assert row["pTM"] == pytest.approx(float(m["ptm"]), rel=5e-3)
        np.testing.assert_allclose(row["plddt"], m["plddt"], atol=0.005 + 1e-6)
        np.testing.assert_allclose(row["pae"], m["predicted_aligned_error"], atol=0.005 + 1e-6)
        assert row["max_pae"] == pytest.approx(float(m["predicted_aligned_error"].max()))
        if which == "complex":
            assert row["iptm"] == pytest.approx(float(m["iptm"]), abs=5e-5)
