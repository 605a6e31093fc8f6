"""examples/slurm/pretrain.sbatch under a fake SLURM (issue 22, item 4): the batch script runs as
sbatch would run it on the first node, with SLURM's variables set and stub `srun` / `scontrol`
on PATH (written here). The stub srun starts SLURM_NNODES x --ntasks-per-node tasks on this
host with SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID, as srun does.

1. LAUNCH=torchrun (default): one torchrun agent per "node", c10d rendezvous on the first
   node: 2 ranks come up, train 2 iterations, checkpoint.
2. LAUNCH=srun: one task per rank, ranks read by init_distributed from SLURM's variables; the
   job resumes from the checkpoint of run 1 (--load), and USR1 (SLURM's preemption warning)
   makes the script requeue the job while training carries on to the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_fixtures import build_pairs_store
from protdp.paths import REPO_ROOT
from protdp.train import checkpointing
from protdp.train.launch import free_port, worker_env

SBATCH = REPO_ROOT / "examples" / "slurm" / "pretrain.sbatch"
FAMILIES = {"2q2k_A", "5awl_A", "7a4d_E", "102m_A", "T1055"}
JOB_ID = "4242"

SRUN = '''#!{python}
"""Stub srun: SLURM_NNODES x --ntasks-per-node tasks here, each with SLURM's task variables."""
import os, subprocess, sys
args, opts = sys.argv[1:], {{}}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
with open(os.environ["SLURM_STUB_LOG"], "a") as log:
    log.write("srun " + " ".join(sys.argv[1:]) + "\\n")
per_node = int(opts.get("ntasks-per-node", "1"))
tasks = int(os.environ["SLURM_NNODES"]) * per_node
procs = [subprocess.Popen(args, env={{**os.environ, "SLURM_PROCID": str(i),
         "SLURM_LOCALID": str(i % per_node), "SLURM_NODEID": str(i // per_node),
         "SLURM_NTASKS": str(tasks), "SLURM_NTASKS_PER_NODE": str(per_node),
         "SLURM_STEPID": "0"}}) for i in range(tasks)]
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
'''

SCONTROL = '''#!/bin/bash
echo "scontrol $*" >> "$SLURM_STUB_LOG"
if [ "$1 $2" = "show hostnames" ]; then   # every fake node is this host; a long list (as a
  # large allocation has) so a reader that closes the pipe early breaks the job every time
  for ((i = 0; i < 20000; i++)); do echo localhost; done
fi
'''


@pytest.fixture(scope="module")
def store(data_dir, tmp_path_factory) -> Path:
    return build_pairs_store(data_dir, FAMILIES, tmp_path_factory.mktemp("store"))


@pytest.fixture
def fake_slurm(tmp_path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN.format(python=sys.executable))
    (bin_dir / "scontrol").write_text(SCONTROL)
    for name in ("srun", "scontrol"):
        (bin_dir / name).chmod(0o755)
    env = worker_env()
    for key in [k for k in env if k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_",
                                                 "MASTER_", "OMPI_", "TORCHELASTIC"))]:
        del env[key]
    env.update(PATH=f"{bin_dir}:{env['PATH']}", SLURM_STUB_LOG=str(tmp_path / "slurm.log"),
               SLURM_JOB_ID=JOB_ID, SLURM_JOB_NAME="protdp-test", SLURM_NNODES="2",
               SLURM_JOB_NODELIST="node[01-02]", SLURM_CPUS_PER_TASK="1",
               PYTHON=sys.executable, NPROC_PER_NODE="1", GLOO_SOCKET_IFNAME="lo",
               MASTER_PORT=str(free_port()), MODEL_CONFIG="configs/model/tiny.yaml",
               SAVE_INTERVAL="1", CKPT=str(tmp_path / "ckpt"))
    return env


def _flags(iters: int) -> list[str]:
    return ["--config", "configs/train/tiny.yaml", "--global-batch-size", "2", "--train-iters",
            str(iters), "--eval-iters", "0", "--log-interval", "1",
            "--distributed-timeout-minutes", "1", "--val-fraction", "0"]


def _sbatch(env: dict, store: Path, iters: int, **extra) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(SBATCH), *_flags(iters)],
                            env={**env, "DATA": str(store), **extra}, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sbatch_launch_line_brings_up_ranks_and_requeues(store, fake_slurm, tmp_path):
    log = tmp_path / "slurm.log"
    proc = _sbatch(fake_slurm, store, iters=2)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-4000:]
    assert "dp=2 (torchrun)" in out and "starting from scratch" in out
    calls = log.read_text()
    assert "scontrol show hostnames node[01-02]" in calls
    port = fake_slurm["MASTER_PORT"]
    assert (f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {sys.executable} -m "
            f"torch.distributed.run --nnodes 2 --nproc_per_node 1 --rdzv_id {JOB_ID} "
            f"--rdzv_backend c10d --rdzv_endpoint localhost:{port} -m protdp.train") in calls
    ckpt = Path(fake_slurm["CKPT"])
    assert checkpointing.latest_checkpoint(ckpt).name == checkpointing.iter_dir_name(2)

    # the requeued job: srun tasks as ranks (SLURM_PROCID), resumes from the checkpoint; USR1
    # (SLURM's warning before preemption) -> scontrol requeue, and training still completes
    proc = _sbatch(fake_slurm, store, iters=4, LAUNCH="srun", MASTER_PORT=str(free_port()))
    deadline = time.monotonic() + 120
    started = f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {sys.executable} -m protdp.train"
    while started not in log.read_text():   # the ranks are importing torch: seconds to go
        assert time.monotonic() < deadline and proc.poll() is None, "srun never started"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGUSR1)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-4000:]
    assert "dp=2 (slurm)" in out and "at iteration 2" in out and "resumed from" in out
    assert f"scontrol requeue {JOB_ID}" in log.read_text() and "requeue" in out
    assert checkpointing.latest_checkpoint(ckpt).name == checkpointing.iter_dir_name(4)


def test_sbatch_rejects_an_unknown_launcher(fake_slurm, store):
    proc = _sbatch(fake_slurm, store, iters=1, LAUNCH="mpirun")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "LAUNCH=mpirun: expected torchrun or srun" in out
