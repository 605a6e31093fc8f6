"""Fine-tuning AlphaFold-Multimer on complexes (protdp.train.complex) from the imported fixture
weights: 2 ranks on gloo with --overlap-grad-reduce --use-distributed-optimizer, split in two
runs joined by a checkpoint resume, against one process with twice the accumulation (the same
complexes, crops and MSA samples by construction): same losses, same parameters within float
rounding; the weights moved away from the imported ones; the EMA weights come out as a
multimer checkpoint `protdp complex predict` reads."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from complex_fixtures import GOOD_ROWS, import_fixture_model, write_manifest
from protdp.complex.store import build_complex_store
from protdp.paths import REPO_ROOT
from protdp.train import checkpointing
from protdp.train.launch import torchrun_cmd, worker_env


def _argv(store, mm, save, iters, load=None):
    argv = ["--config", "configs/train/complex_finetune.yaml", "--data", str(store),
            "--finetune-from", str(mm), "--save", str(save), "--crop-size", "24",
            "--max-msa-rows", "4", "--global-batch-size", "2", "--train-iters", str(iters),
            "--save-interval", "1", "--seed", "3", "--distributed-timeout-minutes", "1",
            "--overlap-grad-reduce", "--use-distributed-optimizer"]
    return argv + (["--load", str(load)] if load else [])


def _run(argv, nproc):
    proc = subprocess.run(torchrun_cmd(argv, nproc=nproc), env=worker_env(), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def _params(ckpt):
    return torch.load(ckpt / checkpointing.ENGINE / "model.pt", weights_only=True)["model"]


def _losses(save):
    rows = [json.loads(ln) for ln in (save / "metrics.jsonl").read_text().splitlines()]
    return {r["iteration"]: r["loss"] for r in rows if "loss" in r and "iteration" in r}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ft")
    build_complex_store(write_manifest(d / "m.tsv", GOOD_ROWS[4:]), d / "c.h5")   # 2q2k
    mm = import_fixture_model(d / "mm")
    one, two = d / "one", d / "two"
    out1 = _run(_argv(d / "c.h5", mm, one, 2), nproc=1)
    _run(_argv(d / "c.h5", mm, two, 1), nproc=2)
    out2 = _run(_argv(d / "c.h5", mm, two, 2, load=two), nproc=2)
    return mm, one, two, out1, out2


def test_two_ranks_with_resume_equal_one_process(runs):
    mm, one, two, out1, out2 = runs
    assert "fine-tuning on complexes" in out1 and "resumed from" in out2
    assert "dp=2" in out2 and "overlap_grad_reduce=True, distributed_optimizer=True" in out2
    a, b = _params(one / "iter_0000002"), _params(two / "iter_0000002")
    assert a.keys() == b.keys()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff < 1e-5, diff
    la, lb = _losses(one), _losses(two)
    assert set(la) == set(lb) == {1, 2}
    for it in la:
        assert la[it] == pytest.approx(lb[it], rel=1e-5)


def test_weights_moved_and_come_out_as_a_multimer_checkpoint(runs):
    mm, one, two, _, _ = runs
    start = torch.load(mm / "multimer_model.pt", weights_only=True)["state_dict"]
    after = _params(one / "iter_0000002")
    moved = [k for k in start if not torch.equal(start[k], after[k])]
    assert len(moved) > len(start) // 2
    from protdp.weights.multimer_checkpoint import load_multimer

    model = load_multimer(one)                       # the EMA weights, `weights import` layout
    assert set(model.state_dict()) == set(start)
