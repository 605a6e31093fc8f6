"""The predictor against the training side: it loads a checkpoint written by the real
training checkpoint code (`protdp.train.checkpointing` + `protdp.parallel.save_checkpoint`),
preferring EMA weights; and `pipelines/predict.py` under torchrun shares the targets through
the work queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from protdp.config import to_dict
from protdp.inference.checkpoint import load_model_checkpoint, save_model_checkpoint
from protdp.workflows import predict
from protdp.inference.writers import read_summary
from protdp.model import build_model
from protdp.parallel import DataParallel, ParallelConfig, init_distributed
from protdp.parallel import save_checkpoint as engine_save
from protdp.paths import REPO_ROOT
from protdp.train import checkpointing
from protdp.train.ema import EMA
from protdp.inference.layout import current_prediction

TINY = REPO_ROOT / "configs" / "model" / "tiny.yaml"


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def world_of_one():
    created = not dist.is_initialized()
    init_distributed(timeout=60)
    yield
    if created and dist.is_initialized():
        dist.destroy_process_group()


def write_training_checkpoint(run_dir, iteration: int):
    """What the trainer does at a save (Trainer.save), in a world of 1."""
    torch.manual_seed(1)
    model = build_model(TINY, verbose=False)
    ema = EMA(model)                        # shadow = the initial weights
    with torch.no_grad():                   # "training" moves the raw weights away from the EMA
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    ddp = DataParallel(model, ParallelConfig(data_parallel_size=1, micro_batch_size=1,
                                             global_batch_size=1))
    saver = checkpointing.Saver(rank=0, world_size=1, barrier=lambda: None,
                                save_engine=lambda p: engine_save(p, ddp, None))
    path = checkpointing.save_checkpoint(
        saver, run_dir, iteration, ema_state=ema.state_dict(), rank_state={"iteration": iteration},
        config={"crop_size": 40, "max_msa_rows": 16, "model": to_dict(model.config)})
    return path, ema, ddp.module


def test_loads_training_checkpoint_prefers_ema(tmp_path, world_of_one):
    run = tmp_path / "run"
    write_training_checkpoint(run, 5)
    it_dir, ema, raw = write_training_checkpoint(run, 9)
    loaded = load_model_checkpoint(run)                 # the run folder -> newest iteration
    assert loaded.path == it_dir.resolve() and loaded.iteration == 9
    assert (loaded.kind, loaded.weights, loaded.training_crop, loaded.max_msa_rows) == (
        "training-checkpoint", "ema", 40, 16)
    state = loaded.model.state_dict()
    raw_state = raw.state_dict()
    for name, shadow in ema.shadow.items():
        assert torch.equal(state[name], shadow.to(state[name].dtype)), name
    assert any(not torch.equal(state[n], raw_state[n]) for n in ema.shadow)
    assert load_model_checkpoint(it_dir).sha256 == loaded.sha256     # same files, same digest

    (it_dir / "ema.pt").unlink()                       # no EMA: the raw weights
    raw_loaded = load_model_checkpoint(it_dir)
    assert raw_loaded.weights == "raw" and raw_loaded.sha256 != loaded.sha256
    assert all(torch.equal(v, raw_state[k]) for k, v in raw_loaded.model.state_dict().items())

    fasta = tmp_path / "t.fasta"
    fasta.write_text(">a\nMKTAYIAKQRQISFVKSHFSRQIEEKLGLIEVQAPILSRVGDGTQDNLSGAEK\n")
    res = predict(run, fasta, tmp_path / "out", progress=False, release_gate="off")
    prov = json.loads((current_prediction(tmp_path / "out" / "targets" / "a") / "provenance.json").read_text())
    assert prov["checkpoint"]["kind"] == "training-checkpoint" and prov["checkpoint"]["iteration"] == 9
    assert "length_beyond_training_crop" in res.rows[0]["reasons"]     # 52 > crop 40


def test_torchrun_two_ranks_share_the_work_queue(tmp_path):
    torch.manual_seed(0)
    ckpt = save_model_checkpoint(build_model(TINY, verbose=False), None, tmp_path / "m.pt")
    seqs = ["MKTAYIAK", "GSHMLEDP", "MQIFVKTL", "YYDPETGTWY", "MK?"]
    fasta = tmp_path / "t.fasta"
    fasta.write_text("".join(f">t{i}\n{s}\n" for i, s in enumerate(seqs)))
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone",
           "--nproc_per_node", "2", str(REPO_ROOT / "pipelines" / "predict.py"),
           "--checkpoint", str(ckpt), "--fasta", str(fasta), "--out", str(out), "--no-progress",
           "--allow-unreleased",
           "--dist-timeout-minutes", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_summary(out / "summary.tsv")
    assert [r["target"] for r in rows] == [f"t{i}" for i in range(5)]
    assert [r["route"] for r in rows] == ["needs_review"] * 4 + ["rejected"]
    # claimed from the run's work queue, costliest first: every target by one rank, once
    ranks = [json.loads((current_prediction(out / "targets" / f"t{i}") / "provenance.json")
                        .read_text())["rank"] for i in range(4)]
    assert set(ranks) <= {0, 1}
    summary_csv = (out / "summary.csv").read_text().splitlines()[1:]
    assert sorted(line.split(",")[0] for line in summary_csv) == [f"t{i}" for i in range(5)]
    assert "5 targets: 0 accepted, 4 need review, 1 rejected" in proc.stdout
