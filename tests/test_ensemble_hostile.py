"""A NaN ensemble member (issue 47 D2): a second checkpoint whose weights overflow (1e30, which
an old import accepted) makes its predictions NaN. The member is recorded as failed in
ranking_debug.json, the other member is ranked and written, and the target is predicted (main:
`LinAlgError: SVD did not converge` in the ensemble spread, rc 1, nothing written).
Reference: the good checkpoint alone gives the same top model."""

from __future__ import annotations

import json

import numpy as np
import torch

from model_fixtures import one_thread, tiny_config  # noqa: F401
from protdp.inference.checkpoint import save_model_checkpoint
from protdp.inference.layout import current_prediction
from protdp.inference.ranking import member_failure, split_failed
from protdp.model import build_model
from protdp.workflows import predict


def test_a_nan_member_is_failed_and_the_others_ranked(tmp_path):
    torch.manual_seed(0)
    cfg = tiny_config()
    good = build_model(cfg, verbose=False)
    save_model_checkpoint(good, cfg, tmp_path / "good.pt")
    bad = build_model(cfg, verbose=False)
    bad.load_state_dict(good.state_dict())
    with torch.no_grad():
        for p in bad.parameters():
            p.mul_(1e30)
    save_model_checkpoint(bad, cfg, tmp_path / "huge.pt")
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">a\nMKVLAAGIVGLLLAAQ\n>b\nGSHMKVLW\n")
    both = predict([str(tmp_path / "good.pt"), str(tmp_path / "huge.pt")], fasta, tmp_path / "o",
                   release_gate="review", device="cpu", progress=False)
    alone = predict(str(tmp_path / "good.pt"), fasta, tmp_path / "ref", release_gate="review",
                    device="cpu", progress=False)
    for row, ref in zip(both.rows, alone.rows):
        assert row["route"] != "rejected" and row["mean_plddt"] == ref["mean_plddt"], row
        folder = current_prediction(tmp_path / "o" / "targets" / row["file_name"])
        debug = json.loads((folder / "ranking_debug.json").read_text())
        assert list(debug["failed_members"]) == ["model_2_seed_000"], debug
        assert debug["order"] == ["model_1_seed_000"]
        assert "NaN" in debug["failed_members"]["model_2_seed_000"]


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
