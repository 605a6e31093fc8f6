"""Features prefetched in a worker process while the model runs (issue 45): the prefetched MSA
and features are the inline ones (identical predictions), the predictor does not featurize
again, and a target whose features fail in the worker is still a summary row with its reason
while the rest go on."""

from __future__ import annotations

import json

import numpy as np
import torch
import yaml

from protdp.inference.checkpoint import save_model_checkpoint
from protdp.inference.layout import current_prediction
from protdp.inference.predictor import PredictConfig, Predictor
from protdp.model.model import build_model
from protdp.paths import REPO_ROOT
from protdp.workflows import predict

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
