"""`--engine deepspeed` (issue 22, item 5): DeepSpeed's ZeRO-1/2 engine and optimizer behind the
trainer, on 2 CPU ranks (torchrun, gloo): the loss curve and gradient norms match protdp's engine
on the same seed within fp32 noise, a run resumes from DeepSpeed's own checkpoint, the Megatron
flags map onto DeepSpeed's config as DeepSpeed itself reads it, and bad combinations fail with
one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from data_fixtures import build_pairs_store
from protdp.paths import REPO_ROOT
from protdp.train import checkpointing
from protdp.train.args import parse_args
from protdp.train.deepspeed_engine import deepspeed_config
from protdp.train.launch import torchrun_cmd, worker_env
from protdp.train.report import read_metrics

FAMILIES = {"2q2k_A", "5awl_A", "7a4d_E", "102m_A", "T1055"}


def argv(store: Path, iters: int, *extra: str) -> list[str]:
    # accumulation 2 (global 4 = micro 1 x dp 2 x 2), clipping, warmup: every mapped flag acts
    return ["--config", "configs/train/tiny.yaml", "--data", str(store), "--global-batch-size",
            "4", "--train-iters", str(iters), "--eval-iters", "0", "--log-interval", "1",
            "--val-fraction", "0", "--distributed-timeout-minutes", "2", "--seed", "3", *extra]


def train(store: Path, run_dir: Path, iters: int, *extra: str) -> tuple[list[dict], str]:
    proc = subprocess.run(torchrun_cmd([*argv(store, iters, *extra), "--log-dir", str(run_dir)],
                                       nproc=2), env=worker_env(), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return read_metrics(run_dir / "metrics.jsonl")[0], out


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ds")
    store = build_pairs_store(data_dir, FAMILIES, tmp)
    ref, _ = train(store, tmp / "protdp", 4, "--use-distributed-optimizer", "--save",
                   str(tmp / "protdp_ckpt"), "--save-interval", "4")
    first, _ = train(store, tmp / "zero1_a", 2, "--engine", "deepspeed", "--save",
                     str(tmp / "zero1_ckpt"), "--save-interval", "2")
    resumed, out = train(store, tmp / "zero1_b", 4, "--engine", "deepspeed", "--load",
                         str(tmp / "zero1_ckpt"))
    zero2, _ = train(store, tmp / "zero2", 4, "--engine", "deepspeed", "--zero-stage", "2")
    return {"store": store, "tmp": tmp, "protdp": ref, "zero1": first + resumed,
            "resume_out": out, "zero2": zero2}


@pytest.mark.parametrize("stage", ["zero1", "zero2"])
def test_loss_curve_matches_protdp_engine(runs, stage):
    ref, ds = runs["protdp"], runs[stage]
    assert [r["iteration"] for r in ds] == [1, 2, 3, 4]
    for a, b in zip(ref, ds):
        # same data, init and AdamW math: only fp32 summation order differs
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), (a["iteration"], stage)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4), (a["iteration"], stage)
        assert not b["skipped"]
    assert len({round(r["loss"], 4) for r in ref}) == 4    # the weights really moved


def test_resume_from_deepspeed_checkpoint(runs):
    assert "resumed from" in runs["resume_out"] and "at iteration 2" in runs["resume_out"]
    ckpt = runs["tmp"] / "zero1_ckpt" / checkpointing.iter_dir_name(2)
    files = sorted(p.name for p in (ckpt / checkpointing.ENGINE / "deepspeed").iterdir())
    assert files == ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    weights = checkpointing.read_weights(ckpt)   # prediction reads it like any checkpoint
    assert weights.meta["config"]["engine"] == "deepspeed" and weights.ema_shadow is not None
    theirs = checkpointing.read_weights(runs["tmp"] / "protdp_ckpt").state_dict
    assert {k: v.shape for k, v in weights.state_dict.items()} == {
        k: v.shape for k, v in theirs.items()}


def test_config_follows_the_megatron_flags():
    from deepspeed.runtime.config import DeepSpeedConfig

    flags = ["--micro-batch-size", "2", "--clip-grad", "0.5", "--bucket-size", "123456",
             "--no-overlap-grad-reduce", "--zero-stage", "2", "--lr", "3e-4", "--adam-eps",
             "1e-7", "--engine", "deepspeed"]
    args = parse_args([*flags, "--global-batch-size", "24", "--data-parallel-size", "3"])
    cfg = deepspeed_config(args, dp=3)
    zero = cfg["zero_optimization"]
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"],
            cfg["gradient_accumulation_steps"]) == (24, 2, 4)
    assert cfg["gradient_clipping"] == 0.5 and zero["stage"] == 2 and not zero["overlap_comm"]
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 123456
    assert cfg["optimizer"]["params"]["eps"] == 1e-7 and cfg["optimizer"]["params"]["lr"] == 3e-4
    # DeepSpeed's own parser (one process: world 1) reads the same numbers back
    one = deepspeed_config(parse_args([*flags, "--global-batch-size", "8",
                                       "--data-parallel-size", "1"]), dp=1)
    parsed = DeepSpeedConfig(one)
    assert (parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu,
            parsed.gradient_accumulation_steps) == (8, 2, 4)
    assert parsed.zero_optimization_stage == 2 and parsed.gradient_clipping == 0.5
    assert parsed.zero_config.reduce_bucket_size == 123456 and not parsed.zero_config.overlap_comm
    default = deepspeed_config(parse_args(["--data-parallel-size", "2", "--engine", "deepspeed"]),
                               dp=2)
    assert default["zero_optimization"]["reduce_bucket_size"] == 40_000_000   # Megatron's


@pytest.mark.parametrize("flags, message", [
    (["--engine", "megatron"], "--engine: 'megatron' is not one of protdp|deepspeed"),
    (["--engine", "deepspeed", "--zero-stage", "3"], "--zero-stage: DeepSpeed ZeRO stage 1 or 2"),
    (["--engine", "deepspeed", "--use-distributed-optimizer", "--overlap-param-gather"],
     "--overlap-param-gather: is protdp's engine"),
])
def test_bad_engine_flags(flags, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "protdp.train", "--data", str(tmp_path / "x.h5"),
                           *flags], env=worker_env(), cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1


def test_deepspeed_refuses_a_protdp_checkpoint(runs):
    proc = subprocess.run([sys.executable, "-m", "protdp.train",      # one rank, no launcher
                           *argv(runs["store"], 5, "--engine", "deepspeed"), "--load",
                           str(runs["tmp"] / "protdp_ckpt"), "--log-dir",
                           str(runs["tmp"] / "refused")], env=worker_env(), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no DeepSpeed checkpoint here (written by --engine protdp?)" in proc.stderr


def test_deepspeed_resume_refuses_weights_beyond_the_bound(runs):
    """DeepSpeed reads its own files (issue 47 D3): the weights it loaded are checked before any
    step, a 1e30 in its fp32 master partition is one line naming the folder and the weight."""
    import shutil

    import torch

    hostile = runs["tmp"] / "zero1_hostile"
    shutil.copytree(runs["tmp"] / "zero1_ckpt", hostile)
    for shard in hostile.glob("iter_*/engine/deepspeed/zero_pp_rank_*_optim_states.pt"):
        blob = torch.load(shard, weights_only=False)    # DeepSpeed's own (trusted test) file
        with torch.no_grad():
            blob["optimizer_state_dict"]["single_partition_of_fp32_groups"][0][0] = 1e30
        torch.save(blob, shard)
    proc = subprocess.run(torchrun_cmd([*argv(runs["store"], 4, "--engine", "deepspeed"),
                                        "--load", str(hostile), "--log-dir",
                                        str(runs["tmp"] / "hostile_run")], nproc=2),
                          env=worker_env(), cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "exitcode  : 2" in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line and "1e+30" in line]
    assert errors and all(f"{hostile}/iter_0000002/engine/deepspeed: field 'optimizer': weight "
                          "'fp32 master partition 0" in e for e in errors), proc.stderr[-3000:]
    assert "iter 3" not in proc.stderr               # refused before any step
