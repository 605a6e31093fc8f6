"""ColabFold's CSV form for complexes (issue 47 D5): `id,sequence` rows with ':' between chains
predict with a multimer checkpoint exactly as the same complexes in ColabFold's FASTA form
(reference: the FASTA run, atom for atom), a bad row is its own rejected row, and a monomer
checkpoint answers with a line that says a multimer checkpoint is needed."""

from __future__ import annotations

import numpy as np
import torch

from model_fixtures import one_thread, tiny_config  # noqa: F401
from protdp.cli import main as protdp_main
from protdp.inference.checkpoint import save_model_checkpoint
from protdp.inference.writers import read_summary
from protdp.model import build_model
from test_complex_predict import COMMON, ckpt  # noqa: F401  (fixture)

A, B = "MKVLAAGIVGLLLAAQ", "GSHMKVLWEEL"


def _pdb_atoms(folder):
    lines = [ln for ln in (folder / "ranked_0.pdb").read_text().splitlines()
             if ln.startswith("ATOM")]
    return np.array([[float(ln[30:38]), float(ln[38:46]), float(ln[46:54])] for ln in lines])


def test_csv_complex_predicts_as_the_fasta_form(ckpt, tmp_path):  # noqa: F811
    csv = tmp_path / "batch.csv"
    csv.write_text(f"id,sequence\nc1,{A}:{B}\nbad,{A}:\nc2,{B}:{B}\n")
    fasta = tmp_path / "batch.fasta"
    fasta.write_text(f">c1\n{A}:{B}\n>c2\n{B}:{B}\n")
    for src, out in ((csv, "o_csv"), (fasta, "o_fa")):
        assert protdp_main(["predict", "--checkpoint", str(ckpt), "--fasta", str(src), "--out",
                            str(tmp_path / out), *COMMON]) == 0
    rows = {r["target"]: r for r in read_summary(tmp_path / "o_csv" / "summary.tsv")}
    ref = {r["target"]: r for r in read_summary(tmp_path / "o_fa" / "summary.tsv")}
    assert rows["bad"]["route"] == "rejected" and "batch.csv:3" in rows["bad"]["detail"]
    for cid in ("c1", "c2"):
        assert rows[cid]["route"] != "rejected", rows[cid]
        assert rows[cid]["mean_plddt"] == ref[cid]["mean_plddt"]


def test_csv_complex_with_a_monomer_checkpoint_says_what_is_needed(tmp_path):
    torch.manual_seed(0)
    cfg = tiny_config()
    save_model_checkpoint(build_model(cfg, verbose=False), cfg, tmp_path / "m.pt")
    csv = tmp_path / "batch.csv"
    csv.write_text(f"id,sequence\nc1,{A}:{B}\nmono,{A}\n")
    assert protdp_main(["predict", "--checkpoint", str(tmp_path / "m.pt"), "--fasta", str(csv),
                        "--out", str(tmp_path / "o"), *COMMON]) == 0
    rows = {r["target"]: r for r in read_summary(tmp_path / "o" / "summary.tsv")}
    assert "needs a multimer checkpoint" in rows["c1"]["detail"]
    assert rows["mono"]["route"] != "rejected"
