"""`protdp predict --bf16` (monomers and complexes): the flag reaches the model (the trunk
config while predicting, provenance.json, scores.json's trunk_dtype, outputs that moved) and
is switched back afterwards; the prediction stays within the bf16-vs-fp32 tolerances the
model tests state: monomer, atoms max |diff| < 2.0 Å and Cα RMS < 0.75 Å (tests/test_model_bf16.py,
the whole model on the AF2 reference fixture) and pLDDT < 5 (tests/test_model_model.py, tiny
random-weight model); complex (tests/test_multimer_model.py, the AlphaFold-Multimer fixture)
pLDDT < 1.0, ipTM < 1e-2."""

from __future__ import annotations

import hashlib
import json

import gemmi
import numpy as np
import pytest

from protdp.cli import main as protdp_main
from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
from protdp.inference.layout import current_prediction
from protdp.inference.predictor import PredictConfig, Predictor
from test_complex_predict import COMMON, _msa_dir, ckpt as multimer_ckpt  # noqa: F401
from test_complex_pairing import RAW
from test_predict import tiny_model


def _atoms(pdb) -> np.ndarray:
    """Heavy atoms [N, 3] and which are Cα [N] of the PDB's first chain."""
    st = gemmi.read_structure(str(pdb))
    atoms = [a for r in st[0][0] for a in r]
    return np.array([a.pos.tolist() for a in atoms]), np.array([a.name == "CA" for a in atoms])


def _run(tmp_path, name: str, args: list[str]) -> "Path":  # noqa: F821
    out = tmp_path / name
    assert protdp_main(["predict", *args, "--out", str(out), *COMMON]) == 0
    return out


def test_bf16_flag_monomer(tmp_path):
    ckpt = save_model_checkpoint(tiny_model(), None, tmp_path / "tiny.pt", training_crop=32,
                                 max_msa_rows=16)
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">p\nMKTAYIAKQRQISFVKSHFSRQ\n")
    runs = {}
    for name, extra in (("fp32", []), ("bf16", ["--bf16"])):
        out = _run(tmp_path, name, ["--checkpoint", str(ckpt), "--fasta", str(fasta), *extra])
        pdir = current_prediction(out / "targets" / "p")
        runs[name] = {"scores": json.loads((pdir / "scores.json").read_text()),
                      "prov": json.loads((pdir / "provenance.json").read_text()),
                      "atoms": _atoms(pdir / "p.pdb")}
    fp32, bf16 = runs["fp32"], runs["bf16"]
    assert fp32["scores"]["trunk_dtype"] == "float32" and bf16["scores"]["trunk_dtype"] == "bfloat16"
    assert bf16["prov"]["config"]["predict"]["bf16"] is True
    assert bf16["prov"]["config"]["model"]["bf16"] is True
    assert fp32["prov"]["config"]["model"]["bf16"] is False
    assert bf16["prov"]["fingerprint"] != fp32["prov"]["fingerprint"]
    # the setting came after prediction folders did: off, it is not in the fingerprint, so
    # folders written before it are skipped on a rerun (hashlib reconstruction, without it
    # nor any other later setting at its default: --batch-seeds auto)
    settings = {k: v for k, v in fp32["prov"]["config"].items() if k != "model"}
    settings["predict"] = {k: v for k, v in settings["predict"].items()   # (pair_mode: later
                           if k not in ("bf16", "pair_mode")                # too, issue 46)
                           and (k, v) != ("batch_seeds", "auto")}
    blob = json.dumps({"settings": settings, "msa": [],
                       "sequence_sha256": fp32["prov"]["inputs"]["sequence_sha256"]},
                      sort_keys=True)
    assert hashlib.sha256(blob.encode()).hexdigest() == fp32["prov"]["fingerprint"]
    (xb, ca), (xf, _) = bf16["atoms"], fp32["atoms"]
    diff = np.abs(xb - xf).max()
    ca_rms = np.sqrt(((xb[ca] - xf[ca]) ** 2).sum(-1).mean())
    dp = np.abs(np.array(bf16["scores"]["plddt"]) - np.array(fp32["scores"]["plddt"])).max()
    print(f"bf16 vs fp32: atoms max {diff:.3f} Å, Cα RMS {ca_rms:.3f} Å, pLDDT max {dp:.3f}")
    assert 1e-3 < diff < 2.0 and ca_rms < 0.75, (diff, ca_rms)   # bf16 ran, within tolerance
    assert dp < 5.0, dp
    # the Python API: the trunk runs bf16 while the predictor holds it, then is restored
    loaded = load_model_checkpoint(ckpt, device="cpu")
    pred = Predictor(loaded, tmp_path / "api", config=PredictConfig(bf16=True),
                     release_gate="off")
    assert loaded.model.config.bf16 is True
    pred.close()
    assert loaded.model.config.bf16 is False


def test_bf16_flag_complex(tmp_path, multimer_ckpt):  # noqa: F811
    from protdp.data.parse import parse_msa
    qa, qb = parse_msa(RAW / "hbA_1-36.a3m").query, parse_msa(RAW / "hbB_1-40.a3m").query
    fasta = tmp_path / "c.fasta"
    fasta.write_text(f">hb\n{qa}:{qb}\n")
    msas = _msa_dir(tmp_path, {"hb": ("hbA_1-36", "hbB_1-40", False)})
    runs = {}
    for name, extra in (("fp32", []), ("bf16", ["--bf16"])):
        out = _run(tmp_path, name, ["--checkpoint", str(multimer_ckpt), "--fasta", str(fasta),
                                    "--msa-dir", str(msas), *extra])
        pdir = current_prediction(out / "targets" / "hb")
        runs[name] = {"scores": json.loads((pdir / "scores.json").read_text()),
                      "prov": json.loads((pdir / "provenance.json").read_text())}
    fp32, bf16 = runs["fp32"], runs["bf16"]
    assert bf16["scores"]["trunk_dtype"] == "bfloat16" and fp32["scores"]["trunk_dtype"] == "float32"
    assert bf16["prov"]["config"]["model"]["trunk"]["bf16"] is True
    dp = np.abs(np.array(bf16["scores"]["plddt"]) - np.array(fp32["scores"]["plddt"])).max()
    assert 1e-4 < dp < 1.0, dp
    assert bf16["scores"]["iptm"] == pytest.approx(fp32["scores"]["iptm"], abs=1e-2)
