"""Features prefetched in a worker process while the model runs (issue 45): the prefetched MSA
and features are the inline ones (identical predictions), the predictor does not featurize
again, and a target whose features fail in the worker is still a summary row with its reason
while the rest go on."""

from __future__ import annotations

import json

import numpy as np
import torch
import yaml

from model_fixtures import af2_reference, one_thread  # noqa: F401
from protdp.inference.checkpoint import save_model_checkpoint
from protdp.inference.layout import current_prediction
from protdp.inference.predictor import PredictConfig, Predictor
from protdp.model.model import build_model
from protdp.paths import REPO_ROOT
from protdp.workflows import predict

TPL_PARAMS = "templates/params/params_model_1_ptm_templates_small.npz"
TINY = yaml.safe_load((REPO_ROOT / "configs" / "model" / "tiny.yaml").read_text())
RECORDS = [("a", "MKTAYIAKQRQISFVKSHFSRQ"), ("b", "GSHMLEDPVDAFQKLAEE"), ("bad", "MKTAYIAKQR"),
           ("c", "MQIFVKTLTGKTITLE")]
MSAS = {"a.a3m": ">a\nMKTAYIAKQRQISFVKSHFSRQ\n>h\nMKTAYIAKQRQLSFVKSHFSRE\n",
        "b.a3m": ">b\nGSHMLEDPVDAFQKLAEE\n>h\nGSHMLEDPIDAFQKLAEE\n>h2\nGSAMLEDPVDAFQKLADE\n",
        "bad.a3m": ">bad\nMKTAYIAKQR\n>h\nMKTAY\n"}          # a row of the wrong length


def test_prefetched_features_are_the_inline_ones(tmp_path, monkeypatch):
    torch.manual_seed(0)
    ckpt = save_model_checkpoint(build_model(TINY, verbose=False), None, tmp_path / "m.pt")
    fasta = tmp_path / "t.fasta"
    fasta.write_text("".join(f">{n}\n{s}\n" for n, s in RECORDS))
    msa_dir = tmp_path / "msa"
    msa_dir.mkdir()
    for name, text in MSAS.items():
        (msa_dir / name).write_text(text)
    cfg = PredictConfig(max_length=120, max_msa_rows=16, num_seeds=2, plots=False)
    kw = dict(msa_dir=msa_dir, config=cfg, progress=False, release_gate="off")
    inline = predict(ckpt, fasta, tmp_path / "inline", **kw)

    featurized = []
    real = Predictor.features

    def counting(self, sequence, *a, **k):
        featurized.append(sequence)
        return real(self, sequence, *a, **k)

    monkeypatch.setattr(Predictor, "features", counting)
    ahead = predict(ckpt, fasta, tmp_path / "ahead", prefetch_workers=1, **kw)
    assert featurized == []                    # every member's features came from the worker
    by = {r["target"]: r for r in ahead.rows}
    assert [r["target"] for r in ahead.rows] == [n for n, _ in RECORDS]
    assert by["bad"]["status"] == "rejected" and "bad.a3m" in by["bad"]["detail"]
    assert by["bad"]["detail"] == {r["target"]: r for r in inline.rows}["bad"]["detail"]
    for r_in, r_ahead in zip(inline.rows, ahead.rows):
        assert (r_in["route"], r_in["msa_depth"], r_in["mean_plddt"]) == (
            r_ahead["route"], r_ahead["msa_depth"], r_ahead["mean_plddt"])
    for name in ("a", "b", "c"):
        s_in, s_ahead = (json.loads((current_prediction(tmp_path / d / "targets" / name) /
                                     "scores.json").read_text()) for d in ("inline", "ahead"))
        np.testing.assert_array_equal(s_in["plddt"], s_ahead["plddt"])
        assert s_in["msa_depth"] == s_ahead["msa_depth"] == {"a": 2, "b": 3, "c": 1}[name]
    assert current_prediction(tmp_path / "ahead" / "targets" / "a").name == \
        current_prediction(tmp_path / "inline" / "targets" / "a").name   # same fingerprint


def test_prefetched_custom_templates_are_the_inline_ones(af2_reference, tmp_path,  # noqa: F811
                                                         monkeypatch):
    """--template: the worker aligns the template (kalign) for the next target; the prediction
    and its provenance are those of the inline alignment, which the process no longer runs;
    a target too short to align is still rejected naming the template file."""
    from protdp.templates.inputs import TemplateProvider
    from protdp.weights import cli as weights_cli
    ckpt = tmp_path / "ckpt"
    assert weights_cli.main(["import", "--format", "alphafold", str(af2_reference / TPL_PARAMS),
                             "--out", str(ckpt), "--sm-layers", "2", "--num-recycles", "0"]) == 0
    raw = af2_reference / "templates" / "raw_inputs"
    fasta = tmp_path / "t.fasta"
    fasta.write_text((raw / "4hhb_B_1-61.fasta").read_text() + ">short\nMKV\n")
    kw = dict(templates=(f"{raw / 'mmcif' / '4hhb.cif'}:A",), release_gate="review",
              device="cpu", progress=False)
    inline = predict(ckpt, fasta, tmp_path / "inline", **kw)
    aligned = []
    real = TemplateProvider.for_target

    def counting(self, query, *a, **k):
        aligned.append(query)
        return real(self, query, *a, **k)

    monkeypatch.setattr(TemplateProvider, "for_target", counting)
    ahead = predict(ckpt, fasta, tmp_path / "ahead", prefetch_workers=1, **kw)
    assert aligned == ["MKV"]     # the good target aligned in the worker only; the failed one
                                  # again inline, where its error becomes the row
    rows = {r["target"]: r for r in ahead.rows}
    assert rows["short"]["route"] == "rejected" and "4hhb.cif" in rows["short"]["detail"]
    name = rows["4hhb_B_1-61"]["file_name"]
    docs = [{f: json.loads((current_prediction(tmp_path / d / "targets" / name) / f).read_text())
             for f in ("scores.json", "provenance.json")} for d in ("inline", "ahead")]
    np.testing.assert_array_equal(docs[0]["scores.json"]["plddt"], docs[1]["scores.json"]["plddt"])
    assert docs[0]["provenance.json"]["templates"] == docs[1]["provenance.json"]["templates"]
    assert docs[1]["provenance.json"]["templates"]["templates"][0]["id"] == "4hhb"
    assert [r["route"] for r in inline.rows] == [r["route"] for r in ahead.rows]
