"""A NaN ensemble member (issue 47 D2) through `protdp predict`, with a second checkpoint the
loader accepts (every |w| <= MAX_WEIGHT_MAGNITUDE) whose forward pass still overflows: its
structure module's initial LayerNorm gives a constant 9e3 and its angle resnet (4 blocks) has
every weight 9e3, so the unnormalised torsions pass float32's 3.4e38 to inf and inf / inf = NaN
positions. The member is recorded as failed in ranking_debug.json, the other member is ranked
and written, and the target is predicted (main: `LinAlgError: SVD did not converge` in the
ensemble spread, rc 1, nothing written). Reference: the good checkpoint alone gives the same
top model. A checkpoint with 1e30 weights (which an old import accepted) is refused by the
loader in one line before anything is predicted (issue 47 D3)."""

from __future__ import annotations

import json

import numpy as np
import torch

from model_fixtures import one_thread, tiny_config  # noqa: F401
from protdp.cli import main as protdp_main
from protdp.data.bounds import MAX_WEIGHT_MAGNITUDE
from protdp.inference.checkpoint import save_model_checkpoint
from protdp.inference.layout import current_prediction
from protdp.inference.ranking import member_failure, split_failed
from protdp.inference.writers import read_summary
from protdp.model import build_model

FASTA = ">a\nMKVLAAGIVGLLLAAQ\n>b\nGSHMKVLW\n"
OVERFLOW = 9e3          # within MAX_WEIGHT_MAGNITUDE; (9e3 * 8)^8 x 1.3e9 passes 3.4e38


def _checkpoints(tmp_path):
    """(good.pt, overflow.pt, huge.pt): the overflow one within the bound, the huge one 1e30."""
    torch.manual_seed(0)
    cfg = tiny_config(n_resnet_blocks=4)
    good = build_model(cfg, verbose=False)
    save_model_checkpoint(good, cfg, tmp_path / "good.pt")
    bad = build_model(cfg, verbose=False)
    bad.load_state_dict(good.state_dict())
    sm = bad.structure_module
    with torch.no_grad():
        sm.norm_s.weight.zero_()
        sm.norm_s.bias.fill_(OVERFLOW)            # s_initial = 9e3 everywhere
        for p in sm.angle_resnet.parameters():
            p.fill_(OVERFLOW)
    assert max(float(v.abs().max()) for v in bad.state_dict().values()
               if v.is_floating_point()) <= MAX_WEIGHT_MAGNITUDE
    save_model_checkpoint(bad, cfg, tmp_path / "overflow.pt")
    with torch.no_grad():
        for p in bad.parameters():
            p.mul_(1e30)
    save_model_checkpoint(bad, cfg, tmp_path / "huge.pt")
    return tmp_path / "good.pt", tmp_path / "overflow.pt", tmp_path / "huge.pt"


def _predict(checkpoints, fasta, out) -> int:
    argv = ["predict", "--fasta", str(fasta), "--out", str(out), "--allow-unreleased",
            "--no-progress", "--device", "cpu"]
    for c in checkpoints:
        argv += ["--checkpoint", str(c)]
    return protdp_main(argv)


def test_a_nan_member_is_failed_and_the_others_ranked(tmp_path, capsys):
    good, overflow, _ = _checkpoints(tmp_path)
    fasta = tmp_path / "t.fasta"
    fasta.write_text(FASTA)
    assert _predict([good, overflow], fasta, tmp_path / "o") == 0
    assert _predict([good], fasta, tmp_path / "ref") == 0
    both = read_summary(tmp_path / "o" / "summary.tsv")
    alone = {r["target"]: r for r in read_summary(tmp_path / "ref" / "summary.tsv")}
    assert [r["target"] for r in both] == ["a", "b"]
    for row in both:
        ref = alone[row["target"]]
        assert row["route"] != "rejected" and row["mean_plddt"] == ref["mean_plddt"], row
        folder = current_prediction(tmp_path / "o" / "targets" / row["file_name"])
        debug = json.loads((folder / "ranking_debug.json").read_text())
        assert list(debug["failed_members"]) == ["model_2_seed_000"], debug
        assert debug["order"] == ["model_1_seed_000"]
        assert "NaN" in debug["failed_members"]["model_2_seed_000"]


def test_a_checkpoint_with_huge_weights_is_refused_in_one_line(tmp_path, capsys):
    good, _, huge = _checkpoints(tmp_path)
    fasta = tmp_path / "t.fasta"
    fasta.write_text(FASTA)
    capsys.readouterr()
    assert _predict([good, huge], fasta, tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(huge) in err and f"> {MAX_WEIGHT_MAGNITUDE:g}" in err and "weight '" in err, err
    assert not (tmp_path / "o" / "targets").exists()     # refused before any prediction


def test_member_failure_kinds():
    L = 4
    ok = {"plddt": np.full(L, 50.0), "positions": np.zeros((L, 37, 3)),
          "atom_mask": np.ones((L, 37)), "ptm": 0.5}
    assert member_failure(ok) is None
    masked_nan = {**ok, "positions": np.where(np.arange(37)[None, :, None] > 30, np.nan, 0.0)
                  * np.ones((L, 37, 3)), "atom_mask": (np.arange(37) <= 30) * np.ones((L, 37))}
    assert member_failure(masked_nan) is None          # absent atoms may hold anything
    for bad in ({**ok, "plddt": np.array([1.0, np.nan, 1, 1])}, {**ok, "ptm": float("inf")},
                {**ok, "positions": np.full((L, 37, 3), np.nan)}):
        assert member_failure(bad)
    preds, failed = split_failed({"a": ok, "b": {**ok, "ptm": float("nan")}})
    assert list(preds) == ["a"] and list(failed) == ["b"]
    preds, failed = split_failed({"b": {**ok, "ptm": float("nan")}})
    assert list(preds) == ["b"] and list(failed) == ["b"]       # all failed: kept for the gate
