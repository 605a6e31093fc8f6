"""`--seeds N` as one batch through the model (issue 45): the batched seeds give the outputs of
the same seeds run one after another (each seed its own MSA sample and masking), the memory
model decides how many seeds fit one batch, and a batch that runs out of memory falls back to
one seed at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from protdp.data.parse import parse_msa
from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
from protdp.inference.ensemble import run_ensemble
from protdp.inference.memory import (BYTES, HEADROOM, TargetSize, choose_chunk_size,
                                     seed_batch_size)
from protdp.inference.predictor import PredictConfig, Predictor
from protdp.model.model import build_model
from protdp.paths import REPO_ROOT

TINY = yaml.safe_load((REPO_ROOT / "configs" / "model" / "tiny.yaml").read_text())
SEQ = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"
MSA = (f">q\n{SEQ}\n>h1\nMKTAYIAKQRQLSFVKSHFSRQLEERLGLIEVQ\n>h2\nMKSAYIAKQRQISFVKAHFSRQLEDRLGLIEVQ\n"
       ">h3\nMKTAYLAKQ-QISFVKSHFSRQLEERLGLIEVQ\n>h4\nMRTAYIAKQRQISFIKSHFSRQLEERLGMIEVQ\n")
N_SEEDS = 3


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    d = tmp_path_factory.mktemp("seeds")
    torch.manual_seed(3)
    model = build_model({**TINY, "pae_head": True}, verbose=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    ckpt = save_model_checkpoint(model, None, d / "m.pt", max_msa_rows=16)
    loaded = load_model_checkpoint(ckpt, device="cpu")
    (d / "q.a3m").write_text(MSA)
    pred = Predictor(loaded, d / "out", release_gate="off",
                     config=PredictConfig(num_seeds=N_SEEDS, seed=11, max_msa_rows=16,
                                          plots=False, batch_seeds="always"))
    return pred, parse_msa(d / "q.a3m")


def test_batched_seeds_equal_sequential_seeds(predictor):
    pred, msa = predictor
    torch.set_num_threads(1)
    batched, timings = run_ensemble(pred, SEQ, msa, "q")
    model = pred.models[0].model
    # the same members one at a time (a replaced forward never batches)
    one_by_one, _ = run_ensemble(pred, SEQ, msa, "q", forward=lambda batch, chunk, hook: model(
        batch, num_recycles=pred.config.num_recycles))
    names = [f"model_1_seed_{s:03d}" for s in range(11, 11 + N_SEEDS)]
    assert list(batched) == list(one_by_one) == names
    assert {batched[n]["seeds_batched"] for n in names} == {N_SEEDS}
    assert all("seeds_batched" not in one_by_one[n] for n in names)
    for n in names:
        for key in ("positions", "plddt", "pae"):
            np.testing.assert_allclose(batched[n][key], one_by_one[n][key], rtol=0, atol=2e-4,
                                       err_msg=f"{n} {key}")
        assert batched[n]["ptm"] == pytest.approx(one_by_one[n]["ptm"], abs=1e-5)
        assert batched[n]["num_recycles"] == one_by_one[n]["num_recycles"]
    # the seeds themselves differ (their own MSA sample and masking), so equality means
    # each batch element kept its own seed's features
    assert np.abs(batched[names[0]]["plddt"] - batched[names[1]]["plddt"]).max() > 1e-2
    assert {f"process_features_{n}" for n in names} <= set(timings)
    # --batch-seeds auto: CUDA only (one batch is slower on a CPU), never: one at a time
    for mode in ("auto", "never"):
        pred.config.batch_seeds = mode
        try:
            again, _ = run_ensemble(pred, SEQ, msa, "q")
        finally:
            pred.config.batch_seeds = "always"
        assert all("seeds_batched" not in again[n] for n in names)
        np.testing.assert_array_equal(again[names[2]]["plddt"], one_by_one[names[2]]["plddt"])


def test_batch_out_of_memory_falls_back_to_one_at_a_time(predictor, monkeypatch):
    pred, msa = predictor
    model = pred.models[0].model
    forward = model.forward
    sizes = []

    def limited(batch, *args, **kwargs):
        sizes.append(int(batch["aatype"].shape[0]))
        if sizes[-1] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(batch, *args, **kwargs)

    monkeypatch.setattr(model, "forward", limited)
    preds, _ = run_ensemble(pred, SEQ, msa, "q")
    assert sizes == [N_SEEDS, 1, 1, 1] and len(preds) == N_SEEDS
    assert all("seeds_batched" not in p for p in preds.values())


def test_memory_model_decides_the_seed_batch(predictor):
    pred, _ = predictor
    cfg, n_params = pred.models[0].model.config, pred.models[0].model.num_parameters()
    size = TargetSize(100, 16)
    chunk, one = choose_chunk_size(cfg, size, n_params, None)
    per_seed = one - BYTES * n_params
    fits = lambda b: int((BYTES * n_params + b * per_seed) * HEADROOM) + 1   # noqa: E731
    assert seed_batch_size(cfg, size, n_params, 5, None) == (5, chunk)
    assert seed_batch_size(cfg, size, n_params, 5, fits(5))[0] == 5
    assert seed_batch_size(cfg, size, n_params, 5, fits(3))[0] == 3
    assert seed_batch_size(cfg, size, n_params, 5, fits(2) - 2)[0] == 1
    assert seed_batch_size(cfg, size, n_params, 1, None)[0] == 1


def test_a_seed_batch_holds_one_seeds_working_set(predictor):
    """The batch of B seeds runs at chunk // B rows, so each chunked step (attention, outer
    product mean) holds at most one seed's working set; the plan's chunk is the one the
    memory model chose for one seed, and the batch records the chunk it ran at."""
    from protdp.inference.ensemble import batch_chunk, seed_groups
    from protdp.inference.memory import working_set_elements
    pred, msa = predictor
    assert [batch_chunk(None, 100, 5), batch_chunk(64, 100, 5), batch_chunk(3, 100, 5),
            batch_chunk(None, 100, 1), batch_chunk(16, 100, 1)] == [20, 12, 1, None, 16]
    cfg, n_params = pred.models[0].model.config, pred.models[0].model.num_parameters()
    size = TargetSize(100, 16)
    plan = seed_groups(pred, pred.models[0], size, 5, True)
    assert (plan.group, plan.seed_chunk) == seed_batch_size(cfg, size, n_params, 5, None)
    one = working_set_elements(cfg, size, plan.seed_chunk)
    batch = working_set_elements(cfg, size, plan.chunk_for(plan.group))
    for step in ("triangle_attention", "msa_column_attention", "outer_product_mean"):
        assert plan.group * batch[step] <= one[step] + plan.group * size.L * size.L * 8, step
    batched, _ = run_ensemble(pred, SEQ, msa, "q")
    assert {r["chunk_size"] for r in batched.values()} == {batch_chunk(
        seed_batch_size(cfg, TargetSize(len(SEQ), 5), n_params, N_SEEDS, None)[1], len(SEQ),
        N_SEEDS)}
