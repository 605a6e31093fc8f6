"""Two prediction folders of `protdp predict` for the output-format tests (issue 41): a
monomer by imported AlphaFold weights (`params_model_3_ptm`, two seeds) and a heterodimer by
an imported AlphaFold-Multimer model (`params_model_1_multimer_v3`), both from the AlphaFold
reference fixture's small parameter files, single-sequence, zero recycles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from protdp.cli import main as protdp_main
from test_complex_pairing import FIXTURE
from test_complex_predict import COMMON

MONOMER = FIXTURE.parent            # af2_reference: params_model_3_ptm_small.npz
SEQ = "MKTAYIAKQRQISFVKSHFSRQLEERLGL"
CHAINS = (SEQ[:22], "GSHMLEDPVAGQACDEFGHIKL")


def prediction(out: Path) -> Path:
    (tdir,) = (out / "targets").iterdir()
    return tdir / (tdir / "CURRENT").read_text().strip()


@pytest.fixture(scope="module")
def monomer_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mono")
    assert protdp_main(["weights", "import", "--format", "alphafold",
                        str(MONOMER / "params" / "params_model_3_ptm_small.npz"), "--out",
                        str(d / "ck"), "--alphafold-config",
                        str(MONOMER / "config_model_3_ptm_small.json")]) == 0
    (d / "in.fasta").write_text(f">mono the monomer record\n{SEQ}\n")
    assert protdp_main(["predict", "--checkpoint", str(d / "ck"), "--fasta",
                        str(d / "in.fasta"), "--out", str(d / "out"), "--seeds", "2",
                        *COMMON]) == 0
    return prediction(d / "out")


@pytest.fixture(scope="module")
def complex_dir(tmp_path_factory, multimer_ckpt):
    d = tmp_path_factory.mktemp("cplx")
    (d / "in.fasta").write_text(f">dimer\n{':'.join(CHAINS)}\n")
    assert protdp_main(["predict", "--checkpoint", str(multimer_ckpt), "--fasta",
                        str(d / "in.fasta"), "--out", str(d / "out"), *COMMON]) == 0
    return prediction(d / "out")


def ours(pdir: Path) -> dict:
    """Per prediction name, best first: the model's float32 outputs (result_<m>.npz) and our
    scores.json ensemble entry."""
    scores = json.loads((pdir / "scores.json").read_text())
    out = {}
    for e in scores["ensemble"]:
        with np.load(pdir / f"result_{e['name']}.npz") as r:
            out[e["name"]] = {**e, **{k: r[k] for k in r.files}}
    return out
